"""Token tagging (CoNLL-2003 NER): first-sub-token labels, sliding windows, word-level predictions.

Each word is split into WordPiece sub-tokens; its label goes on the first sub-token and the other
pieces get -100 (ignored by the loss), the paper's choice (section 5.3). A word the vocabulary cannot
represent at all (e.g. only control characters) becomes one [UNK] so that every word still gets a
prediction; these are counted and reported.

Design decision: sentences longer than `max_seq_length - 2` sub-tokens are not truncated but cut into
overlapping windows that start every `doc_stride` sub-tokens (the SQuAD rule); a word's prediction
comes from the window in which its first sub-token has the most context (`max_context_flags`), so every
word is predicted exactly once. Input is a CoNLL file or a table of token and tag lists (JSONL, Parquet, a
`datasets` directory: `bertkit.data.tag_tables`); predictions go back as the CoNLL file's lines with a tag
column, or for a table as one JSONL object per row.

References: Devlin et al. (2018), sections 4 and 5.3; Tjong Kim Sang & De Meulder (2003).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.config import BertConfig
from bertkit.data.conll import TaggedSentence, check_tags, read_conll, write_conll
from bertkit.data.tag_tables import is_tag_table, read_tag_table
from bertkit.errors import BertkitError
from bertkit.model import BertForTokenClassification
from bertkit.model.feature_based import FeatureHead
from bertkit.settings import TaggingSettings
from bertkit.tasks.metrics import entity_scores
from bertkit.tasks.task import BaseTask, refuse_columns, write_jsonl
from bertkit.tasks.windows import max_context_flags, sliding_windows

log = logging.getLogger(__name__)

IGNORE_INDEX = -100


class TaggingTask(BaseTask):
    """Tagging as a `bertkit.tasks.task.Task`."""

    settings_class = TaggingSettings
    kind = TaggingSettings.kind
    model_class = BertForTokenClassification
    token_level_outputs: ClassVar[tuple[str, ...]] = ("logits",)
    column_settings: ClassVar[tuple[str, ...]] = ("tokens_column", "tags_column")
    settings: TaggingSettings

    @classmethod
    def from_training_file(cls, train_path: str | Path, options: dict[str, Any]) -> TaggingTask:
        """The tag set is the training file's (`labels_from`)."""
        defaults = TaggingSettings(labels=[], **options)
        sentences, _ = read_tagged(train_path, defaults.tag_scheme, defaults.tokens_column, defaults.tags_column)
        return cls(dataclasses.replace(defaults, labels=labels_from(sentences)))

    @classmethod
    def from_config(cls, config: BertConfig, max_seq_length: int | None = None,
                    source: str = "config.json") -> TaggingTask:
        return cls.from_json({"labels": config.label_names or [],
                              **TaggingSettings.fitted_to(config.max_position_embeddings)}, source=source)

    @property
    def metric_names(self) -> tuple[str, ...]:
        return ("f1", "precision", "recall", "accuracy")

    def config_overrides(self) -> dict[str, Any]:
        return {"num_labels": len(self.settings.labels), "id2label": dict(enumerate(self.settings.labels))}

    def feature_head(self) -> FeatureHead:
        return FeatureHead(len(self.settings.labels), per_token=True)

    def with_columns(self, tokens_column: str | None = None, tags_column: str | None = None,
                     **others: Any) -> TaggingTask:
        """This task reading tables by the given columns (the predict/evaluate flags), the saved settings
        filling in the rest; another task's column settings (`others`) are refused."""
        refuse_columns(self.kind, others)
        s = self.settings
        return TaggingTask(dataclasses.replace(s, tokens_column=tokens_column or s.tokens_column,
                                               tags_column=tags_column or s.tags_column))

    def read(self, path: str | Path, labelled: bool = True, training: bool = False,
             ) -> tuple[list[TaggedSentence], list[str]]:
        """Sentences of a CoNLL file or a table (`read_tagged`), tags checked against the scheme. A valid
        tag the model was not trained on stops training; in any other file its sentence is skipped, counted
        and named, as are the table rows that are not a sentence."""
        s = self.settings
        sentences, skipped = read_tagged(path, s.tag_scheme, s.tokens_column, s.tags_column if labelled else None)
        if not labelled:
            return sentences, skipped
        kept, unknown = check_tags(sentences, s.labels)
        if unknown and training:
            raise BertkitError(unknown[0])
        if not kept:
            raise BertkitError(f"{path}: no sentences left; all {len(unknown)} were skipped, first: {unknown[0]}")
        return kept, skipped + unknown

    def features(self, sentences: Sequence[TaggedSentence], tokenizer: Any, training: bool = False) -> list[dict]:
        pieces = tokenizer.encode_ids([word for s in sentences for word in s.words])
        unknown = sum(not p for p in pieces)
        if unknown:
            log.warning("%d words have no WordPiece token (e.g. only control characters) and are read as [UNK]",
                        unknown)
        features, cursor = [], 0
        for index, sentence in enumerate(sentences):
            words = [p or [tokenizer.unk_token_id] for p in pieces[cursor:cursor + len(sentence.words)]]
            cursor += len(sentence.words)
            features.extend(self._windows(tokenizer, sentence, words, index))
        return features

    def _windows(self, tokenizer: Any, sentence: TaggedSentence, words: list[list[int]], index: int) -> list[dict]:
        ids = [i for word in words for i in word]
        # The word whose first sub-token sits at each position, or None for continuation pieces.
        first_of = [w if k == 0 else None for w, word in enumerate(words) for k in range(len(word))]
        label_ids = [self.settings.labels.index(label) for label in sentence.labels] if sentence.labels else None
        spans = sliding_windows(len(ids), self.settings.max_seq_length - 2, self.settings.doc_stride)
        features = []
        for (start, size), flags in zip(spans, max_context_flags(spans)):
            window_words = first_of[start:start + size]
            feature = {
                "input_ids": [tokenizer.cls_token_id, *ids[start:start + size], tokenizer.sep_token_id],
                "token_type_ids": [0] * (size + 2),
                "attention_mask": [1] * (size + 2),
                "sentence_index": index,
                # Word predicted from each position: first sub-tokens in their max-context window only.
                "word_positions": [None, *(w if flag else None for w, flag in zip(window_words, flags)), None],
            }
            if label_ids is not None:
                feature["labels"] = [IGNORE_INDEX, *(IGNORE_INDEX if w is None else label_ids[w]
                                                     for w in window_words), IGNORE_INDEX]
            features.append(feature)
        return features

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits  # (B, T, L)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)
        return loss, {}

    def training_loss(self) -> TaggedTokensObjective:
        return TaggedTokensObjective()


    def decode(self, sentences: Sequence[TaggedSentence], features: Sequence[dict],
               outputs: dict[str, list[np.ndarray]]) -> list[list[str]]:
        """One predicted tag per word of every sentence."""
        predictions: list[list[str | None]] = [[None] * len(s.words) for s in sentences]
        for feature, logits in zip(features, outputs["logits"]):
            best = logits.argmax(axis=-1)  # (T,)
            for position, word in enumerate(feature["word_positions"]):
                if word is not None:
                    predictions[feature["sentence_index"]][word] = self.settings.labels[int(best[position])]
        # Every word has a first sub-token ([UNK] at least) in exactly one max-context window: no None is left.
        return cast(list[list[str]], predictions)

    def score(self, sentences: Sequence[TaggedSentence], predictions: Sequence[Sequence[str]]) -> dict[str, float]:
        gold = cast(list[list[str]], [s.labels for s in sentences])  # read(labelled=True) gives every sentence its tags
        scores = entity_scores(gold, predictions, mode="conlleval")
        words = sum(len(g) for g in gold)
        scores["accuracy"] = sum(a == b for g, p in zip(gold, predictions) for a, b in zip(g, p)) / words
        return scores

    def write_predictions(self, sentences: Sequence[TaggedSentence], predictions: Sequence[Sequence[str]],
                          directory: Path, prefix: str) -> list[Path]:
        """predictions.conll (each CoNLL line and its tag), or for a table predictions.jsonl (one object per
        row read: {"id", "tokens", "tags"})."""
        if sentences and sentences[0].id is not None:
            return [write_jsonl(directory / f"{prefix}predictions.jsonl",
                                ({"id": s.id, "tokens": s.words, "tags": list(tags)}
                                 for s, tags in zip(sentences, predictions, strict=True)))]
        path = directory / f"{prefix}predictions.conll"
        write_conll(path, sentences, predictions)
        return [path]


def read_tagged(path: str | Path, scheme: str, tokens_column: str, tags_column: str | None,
                ) -> tuple[list[TaggedSentence], list[str]]:
    """The sentences of a CoNLL file, or of a table (JSONL, Parquet, a `datasets` directory) by its tokens and
    tags columns, and the table rows skipped; `tags_column` None reads no tags."""
    if is_tag_table(path):
        return read_tag_table(path, tokens_column, tags_column, scheme)
    return read_conll(path, labelled=tags_column is not None, scheme=scheme), []


def labels_from(sentences: Sequence[TaggedSentence]) -> list[str]:
    """The training file's tag set, 'O' first and the rest sorted (stable ids across runs)."""
    tags = {label for s in sentences for label in s.labels or ()}
    return sorted(tags, key=lambda t: (t != "O", t))


class TaggedTokensObjective:
    """Tagging's cross-entropy averaged over the tagged tokens (first sub-tokens) of the whole global batch,
    however it is split into micro-batches and processes (`bertkit.train.loop.Objective`)."""

    def counts(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"tokens": (batch["labels"] != IGNORE_INDEX).sum()}

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], totals: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits  # (B, T, L)
        summed = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX,
                                 reduction="sum")
        return summed / totals["tokens"], {}
