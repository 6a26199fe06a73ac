"""Predictors: a loaded checkpoint directory as plain Python functions (no HTTP, no training code).

`load_predictor(ServeSettings(model=directory))` reads a fine-tuned directory (`bertkit.tasks.finetuned`, the
format fine-tuning writes, feature-based models included) or, without bertkit_task.json, the `architectures`
entry of config.json (the task kind whose head it names, `bertkit.tasks.kinds.kind_of_architecture`), and
returns the predictor for what the weights can do:

    FillMaskPredictor           BertForMaskedLM / BertForPreTraining    fill_mask, embed
    ClassificationPredictor     classification (or regression)          classify, rerank, embed
    TaggingPredictor            tagging                                 tag, embed
    QuestionAnsweringPredictor  squad (v1.1, or v2.0 with no-answer)    answer, embed
    Predictor                   BertModel, any other task kind          embed

Design decision: each `TaskPredictor` names the task class it serves (`task_class`) and builds its features
and decodes its outputs with that task (`bertkit.tasks.*`), so serving uses exactly the windows, sub-token
rules, n-best search and null threshold that produced the dev scores, and runs the model as dev evaluation
does (`bertkit.inference.batching.model_outputs`: length-sorted, padding-free batches); a kind without one
(multiple choice) is served for `embed`. Every method takes a list of inputs and returns one result per input,
equal to what one-by-one calls return. Inputs longer than the model's maximum are cut (`truncate`, the default;
the end of each text, or its start with `truncation_direction="left"`) or refused with `InputTooLongError`.

References: Devlin et al. (2018) sections 3-5 (tasks and the feature-based [CLS] / layer usage);
google-research/bert `run_classifier.py`, `run_squad.py`, `extract_features.py`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch

from bertkit.config import BertConfig, check_model_directory
from bertkit.data.conll import TaggedSentence
from bertkit.data.glue import TextExample
from bertkit.data.squad import SquadExample
from bertkit.errors import BertkitError
from bertkit.inference.batching import check_finite, model_outputs, run_sorted
from bertkit.inference.pooling import sentence_vectors
from bertkit.inference.positions import UntrainedPositions, directory_trained_positions
from bertkit.inference.smoothquant import int8_smoothing
from bertkit.interop.sentence_transformers import (
    SentenceModules,
    choose_pooling,
    cross_encoder_length,
    cross_encoder_sigmoid,
    read_sentence_transformers,
)
from bertkit.model import MODEL_CLASSES, BertModel, accelerate_for_inference
from bertkit.runtime.allocator import keep_freed_memory
from bertkit.runtime.device import apply_threads, check_inference_precision, inference_precision
from bertkit.serve.tokens import Ids, ids_feature, keep_end, token_table
from bertkit.settings import LongDocumentSettings, ServeSettings
from bertkit.tasks.classification import ClassificationTask
from bertkit.tasks.finetuned import load_finetuned, load_weights, read_task_file
from bertkit.tasks.kinds import TASK_CLASSES, kind_of_architecture
from bertkit.tasks.metrics import entities_conlleval
from bertkit.tasks.squad import SquadTask
from bertkit.tasks.tagging import TaggingTask
from bertkit.tasks.task import Task, refuse_columns
from bertkit.tokenizer import MASK, WordPieceTokenizer, check_model_vocabulary

log = logging.getLogger(__name__)

MAX_TOP_K = 100
TRUNCATION_DIRECTIONS = ("right", "left")
FILL_MASK_HEADS = ("BertForMaskedLM", "BertForPreTraining")
"""Heads served as fill-mask (no task kind trains them)."""


class InputTooLongError(BertkitError):
    """An input longer than the model's maximum, sent with truncation off."""

    def __init__(self, index: int, tokens: int, maximum: int) -> None:
        super().__init__(f"input {index} has {tokens} tokens, more than the model's maximum of {maximum}; "
                         "shorten it, or let it be truncated")
        self.index, self.tokens, self.maximum = index, tokens, maximum


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded directory is, as the server describes it (/info, the OpenAI `model` field)."""

    kind: str | None = None
    """What the directory holds: a task kind (bertkit.tasks.kinds), fill-mask or embed; unset:
    what the predictor's class serves."""
    model_id: str = "bertkit"
    """The model's name (load_predictor: the directory's name)."""
    precision: str | None = None
    """The precision the model runs in (what --precision resolved to); unset: the weights' dtype."""
    trained_positions: int | None = None
    """The leading positions its bertkit pre-training trained (`bertkit.inference.positions`); unset: all."""


class Predictor:
    """A model + tokenizer pair that embeds texts; task predictors add their own method."""

    endpoints: tuple[str, ...] = ("embed",)
    """What this predictor does (the server's task endpoints); a classifier's depends on its labels."""
    kind: str = "embed"
    """What the directory holds: a task kind (bertkit.tasks.kinds), fill-mask or embed."""

    def __init__(self, model: torch.nn.Module, tokenizer: WordPieceTokenizer, max_seq_length: int,
                 batch_size: int = 32, sentence: SentenceModules | None = None, info: ModelInfo = ModelInfo()
                 ) -> None:
        # Every bertkit model (FeatureBasedModel too) carries its BertConfig; nn.Module's stubs type attributes
        # as Tensor | Module.
        self.config = cast(BertConfig, model.config)
        check_model_vocabulary(tokenizer, self.config.vocab_size, None)  # load_predictor checked the files
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_seq_length = min(max_seq_length, self.config.max_position_embeddings)
        self.batch_size = batch_size
        self.sentence = sentence
        self.kind = info.kind or type(self).kind
        self.model_id = info.model_id
        first_weight = next(model.parameters(), torch.empty(0))  # float32 for a model without weights
        self.precision = info.precision or ("bf16" if first_weight.dtype == torch.bfloat16 else "fp32")
        """The precision the model runs in."""
        self.untrained = UntrainedPositions(info.trained_positions, self.model_id)

    @property
    def encoder(self) -> BertModel:
        # The head models and FeatureBasedModel keep their encoder as `.bert`.
        return self.model if isinstance(self.model, BertModel) else cast(BertModel, self.model.bert)

    def encode(self, texts: Sequence[str | Ids], text_pairs: Sequence[str] | None = None, truncate: bool = True,
               truncation_direction: str = "right") -> tuple[list[dict[str, Any]], list[int]]:
        """Features of [CLS] text [SEP] (pair [SEP]) of at most max_seq_length tokens, and the tokens each
        input lost. Longer inputs are cut (a pair by Google's rule; "right" keeps the start of each text,
        "left" its end), or with `truncate` False raise InputTooLongError for the first of them. An input given
        as token ids (`Ids`) is read as they are."""
        if truncation_direction not in TRUNCATION_DIRECTIONS:
            raise BertkitError(f"truncation_direction {truncation_direction!r}: use right or left")
        cut_here = truncate and truncation_direction == "right"  # the tokenizer's own truncation
        strings = [t if isinstance(t, str) else "" for t in texts]  # ids: their feature is made below
        encodings = self.tokenizer.encode_batch(strings, text_pairs,
                                                max_length=self.max_seq_length if cut_here else None)
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        for i, (text, encoding) in enumerate(zip(texts, encodings)):
            tokens = len(text) + 2 if isinstance(text, Ids) else len(encoding)
            if not truncate and tokens > self.max_seq_length:
                raise InputTooLongError(i, tokens, self.max_seq_length)
        features = [_feature(e) if cut_here else keep_end(e, self.max_seq_length, cls, sep) for e in encodings]
        # the tokenizer counts what it cut (num_truncated); keep_end's cut is the difference in length
        lost = [e.num_truncated + len(e) - len(f["input_ids"]) for e, f in zip(encodings, features)]
        for i, text in enumerate(texts):
            if isinstance(text, Ids):
                features[i], lost[i] = ids_feature(text, self.max_seq_length, cls, sep, truncation_direction)
        if any(lost):
            log.warning("%d of %d inputs are longer than max_seq_length %d tokens and were truncated",
                        sum(map(bool, lost)), len(texts), self.max_seq_length)
        self.untrained.check([len(f["input_ids"]) for f in features])
        return features, lost

    def run(self, features: Sequence[dict[str, Any]], step: Any) -> list[Any]:
        """`step` over length-sorted batches of `features`, one result per feature; a result holding NaN or inf
        raises ModelFault (it is never answered as a number)."""
        return check_finite(run_sorted(features, step, self.batch_size, self.tokenizer.pad_token_id), self.model_id)

    def task_outputs(self, task: Task, features: Sequence[dict[str, Any]]) -> dict[str, list[np.ndarray]]:
        """The model's outputs that `task.decode` reads, per feature (as dev evaluation computes them); NaN or
        inf in them raises ModelFault."""
        return check_finite(model_outputs(self.model, features, task.output_names, task.token_level_outputs,
                                          self.batch_size, self.tokenizer.pad_token_id), self.model_id)

    def embed(self, texts: Sequence[str], pooling: str = "auto", normalize: bool | None = None,
              truncate: bool = True, truncation_direction: str = "right", prompt_name: str | None = None
              ) -> np.ndarray:
        """(N, H) float32 sentence vectors of the last layer: at [CLS], or its mean, max or
        sum / sqrt(length) over the real tokens (specials included). "auto" and `normalize` None
        follow a sentence-transformers directory (its pooling, Normalize, lowercasing and prompt), so
        the vectors equal its `encode`; elsewhere they mean [CLS] and no normalisation. Long texts: `encode`."""
        return self.embed_with_counts(texts, pooling, normalize, truncate, truncation_direction, prompt_name)[0]

    def embed_with_counts(self, texts: Sequence[str], pooling: str = "auto", normalize: bool | None = None,
                          truncate: bool = True, truncation_direction: str = "right", prompt_name: str | None = None
                          ) -> tuple[np.ndarray, list[int]]:
        """`embed`'s vectors, and the tokens the model read for each text (specials and a prompt included);
        `prompt_name`: one of the directory's named prompts (`prompt_names`) before each text."""
        modes, normalize, width = self.embedding_spec(pooling, normalize)
        if prompt_name is not None and prompt_name not in self.prompt_names:
            raise BertkitError(f"prompt_name {prompt_name!r} is not one of this model's prompts "
                               f"({', '.join(self.prompt_names) or 'it has none'})")
        if self.sentence is not None:  # ids (`Ids`) are read as they are
            texts = [t if isinstance(t, Ids) else self.sentence.prepare(t, prompt_name=prompt_name) for t in texts]
        features, _ = self.encode(texts, truncate=truncate, truncation_direction=truncation_direction)

        def step(batch: dict[str, torch.Tensor]) -> list[np.ndarray]:
            hidden = self.encoder(**batch).last_hidden_state  # (B, T, H), zeros at padding
            return list(sentence_vectors([hidden], batch["attention_mask"], modes, normalize).numpy())

        vectors = np.stack(self.run(features, step)) if features else np.zeros((0, width), np.float32)
        return vectors, [len(f["input_ids"]) for f in features]

    @property
    def prompt_names(self) -> tuple[str, ...]:
        """The named prompts of a sentence-transformers directory (config_sentence_transformers.json)."""
        return tuple(name for name, _ in self.sentence.prompts) if self.sentence is not None else ()

    def embedding_spec(self, pooling: str = "auto", normalize: bool | None = None) -> tuple[tuple[str, ...], bool, int]:
        """(pooling modes, normalised, width) of the vectors `embed` gives with these options."""
        modes, normalize = choose_pooling(pooling, normalize, self.sentence)
        return modes, normalize, len(modes) * self.config.hidden_size

    def tokenize(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[dict[str, Any]]]:
        """Per text, its tokens as the model reads them, never truncated (bertkit.serve.tokens.token_table)."""
        return token_table(self.tokenizer, texts, add_special_tokens)

    def token_vectors(self, texts: Sequence[str], truncate: bool = True, truncation_direction: str = "right",
                      prompt_name: str | None = None) -> list[np.ndarray]:
        """Per text, the last layer's vector of every token it reads ((T, H) float32, [CLS] and [SEP]
        included): TEI's /embed_all."""
        if self.sentence is not None:
            texts = [t if isinstance(t, Ids) else self.sentence.prepare(t, prompt_name=prompt_name) for t in texts]
        features, _ = self.encode(texts, truncate=truncate, truncation_direction=truncation_direction)

        def step(batch: dict[str, torch.Tensor]) -> list[np.ndarray]:
            hidden = self.encoder(**batch).last_hidden_state.float()
            return [h[: int(n)].numpy() for h, n in zip(hidden, batch["attention_mask"].sum(1))]

        return list(self.run(features, step)) if features else []

    def describe(self) -> dict[str, Any]:
        """What the model is and does, for the server's /info (no paths)."""
        modes, normalize, width = self.embedding_spec()
        return {"model_id": self.model_id, "model_type": self.kind,
                "architecture": (self.config.architectures or [type(self.model).__name__])[0],
                "max_input_length": self.max_seq_length, "labels": self.labels, "precision": self.precision,
                "device": str(next(self.model.parameters(), torch.empty(0)).device),
                "vocab_size": self.tokenizer.vocab_size,
                "hidden_size": self.config.hidden_size, "num_hidden_layers": self.config.num_hidden_layers,
                "embedding": {"dimension": width, "pooling": list(modes), "normalize": normalize,
                              "prompt": bool(self.sentence and self.sentence.prompt)}}

    @property
    def labels(self) -> list[str] | None:
        """The label names of a classifier or tagger; None for other models (and for regression)."""
        task = getattr(self, "task", None)
        return getattr(task.settings, "labels", None) if task is not None else None

    def warmup(self) -> None:
        """One real forward pass through every endpoint (the server is ready only after it)."""
        self.embed(["warm up"])


def _feature(encoding: Any) -> dict[str, Any]:
    return {"input_ids": encoding.input_ids, "token_type_ids": encoding.token_type_ids,
            "attention_mask": encoding.attention_mask}


class FillMaskPredictor(Predictor):
    """Masked LM: the top-k vocabulary tokens for every [MASK] of a text."""

    endpoints = ("fill-mask", "embed")
    kind = "fill-mask"

    def fill_mask(self, texts: Sequence[str], top_k: int = 5) -> list[list[list[dict[str, Any]]]]:
        """Per text, per [MASK] (left to right): the `top_k` {token, token_id, score} by probability."""
        if not 1 <= top_k <= min(MAX_TOP_K, self.tokenizer.vocab_size):
            raise BertkitError(f"top_k must be between 1 and {min(MAX_TOP_K, self.tokenizer.vocab_size)}, got {top_k}")
        features = [self._masked_feature(text, i) for i, text in enumerate(texts)]
        mask_id = self.tokenizer.mask_token_id

        def step(batch: dict[str, torch.Tensor]) -> list[list[list[dict[str, Any]]]]:
            masked = batch["input_ids"] == mask_id  # (B, T)
            out = self.model(**batch, masked_positions=masked)
            logits = out.logits if hasattr(out, "logits") else out.prediction_logits  # (N, V), row-major
            logits = logits[:, : self.tokenizer.vocab_size]  # a padded embedding's extra rows are no token
            scores, ids = logits.float().softmax(dim=-1).topk(top_k, dim=-1)  # (N, k)
            per_mask = [self._candidates(s, t) for s, t in zip(scores.tolist(), ids.tolist())]
            counts = masked.sum(dim=1).tolist()
            starts = np.cumsum([0, *counts])
            return [per_mask[starts[i]:starts[i + 1]] for i in range(len(counts))]

        return self.run(features, step)

    def _candidates(self, scores: list[float], ids: list[int]) -> list[dict[str, Any]]:
        tokens = self.tokenizer.convert_ids_to_tokens(ids)
        return [{"token": t, "token_id": i, "score": s} for t, i, s in zip(tokens, ids, scores)]

    def _masked_feature(self, text: str, index: int) -> dict[str, Any]:
        """[CLS] piece [MASK] piece ... [SEP]: the literal '[MASK]' marks the positions to fill."""
        if not isinstance(text, str):
            raise BertkitError(f"inputs[{index}] must be a string, got {type(text).__name__}")
        pieces = text.split(MASK)
        if len(pieces) < 2:
            raise BertkitError(f"inputs[{index}] has no {MASK}; write {MASK} where a token should be predicted, "
                               f"e.g. 'Paris is the {MASK} of France.'")
        ids = [self.tokenizer.cls_token_id]
        for k, piece_ids in enumerate(self.tokenizer.encode_ids(pieces)):
            ids += ([self.tokenizer.mask_token_id] if k else []) + piece_ids
        ids.append(self.tokenizer.sep_token_id)
        if len(ids) > self.max_seq_length:
            raise BertkitError(f"inputs[{index}] has {len(ids)} tokens, more than max_seq_length "
                               f"{self.max_seq_length}; shorten it so every {MASK} keeps its context")
        return {"input_ids": ids, "token_type_ids": [0] * len(ids), "attention_mask": [1] * len(ids)}

    def warmup(self) -> None:
        super().warmup()
        self.fill_mask([f"warm {MASK} up"], top_k=1)


class TaskPredictor(Predictor):
    """A predictor that runs its model with the task that fine-tuned it (`task_class`), as dev evaluation did."""

    task_class: ClassVar[type[Task]]
    """The task kind this predictor serves: `TASK_PREDICTORS` is keyed by its `kind`."""

    def __init__(self, model: torch.nn.Module, tokenizer: WordPieceTokenizer, task: Task, batch_size: int = 32,
                 info: ModelInfo = ModelInfo()) -> None:
        super().__init__(model, tokenizer, task.settings.max_seq_length, batch_size,
                         info=dataclasses.replace(info, kind=info.kind or task.kind))
        self.task = task

    @classmethod
    def of_directory(cls, model: torch.nn.Module, tokenizer: WordPieceTokenizer, task: Task, batch_size: int,
                     info: ModelInfo, directory: Path, saved: bool) -> Predictor:
        """The predictor of a loaded `directory` (`saved`: with bertkit_task.json; else fine-tuned elsewhere)."""
        return cls(model, tokenizer, task, batch_size, info)


class ClassificationPredictor(TaskPredictor):
    """Sentence or sentence-pair classification (label + probabilities), or regression (score); a model with
    one output or two labels also scores (query, text) pairs for reranking."""

    task_class = ClassificationTask
    endpoints: tuple[str, ...] = ("classify", "embed")
    task: ClassificationTask

    def __init__(self, model: torch.nn.Module, tokenizer: WordPieceTokenizer, task: ClassificationTask,
                 batch_size: int = 32, info: ModelInfo = ModelInfo(), sigmoid_scores: bool = False) -> None:
        super().__init__(model, tokenizer, task, batch_size, info)
        labels = task.settings.labels
        if labels is None or len(labels) == 2:  # a relevance score: the value, or the second label's probability
            self.endpoints = ("classify", "rerank", "embed")
        self.sigmoid_scores = sigmoid_scores
        """Rerank scores of a one-output model pass through a sigmoid (a CrossEncoder directory's activation)."""

    @classmethod
    def of_directory(cls, model: torch.nn.Module, tokenizer: WordPieceTokenizer, task: Task, batch_size: int,
                     info: ModelInfo, directory: Path, saved: bool) -> Predictor:
        sigmoid = not saved and cross_encoder_sigmoid(directory, cast(BertConfig, model.config).num_labels or 0)
        return cls(model, tokenizer, cast(ClassificationTask, task), batch_size, info, sigmoid)

    def classify(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None, truncate: bool = True,
                 truncation_direction: str = "right") -> list[dict[str, Any]]:
        """Per input {label, probabilities, truncated}, or {score, truncated} for regression. A model
        fine-tuned with `long_documents` "windows" reads each input in windows and aggregates their logits
        as `bertkit predict` does, adding `windows` (how many were scored); `truncated` then means some
        tokens were in no window (the max_windows cap), `truncate` False refuses such an input, and
        `truncation_direction` does not apply."""
        examples = [TextExample(f"inputs[{i}]", t, None if text_pairs is None else text_pairs[i], None)
                    for i, t in enumerate(texts)]
        if not examples:
            return []
        if self.task.settings.long_documents == "windows":
            return self._classify_windows(examples, truncate)
        features, lost = self.encode(texts, text_pairs, truncate, truncation_direction)
        decoded = self.task.decode(examples, features, self.task_outputs(self.task, features))
        return [{**{k: v for k, v in d.items() if k != "id"}, "truncated": cut > 0} for d, cut in zip(decoded, lost)]

    def _classify_windows(self, examples: Sequence[TextExample], truncate: bool) -> list[dict[str, Any]]:
        features, plans = self.task.window_features(examples, self.tokenizer)
        if not truncate:
            for i, plan in enumerate(plans):
                if plan.truncated:
                    total = sum(map(len, self.tokenizer.encode_ids([examples[i].text, examples[i].text_pair or ""])))
                    total += 3 if plan.is_pair else 2
                    raise InputTooLongError(i, total, self._tokens_read(plan))
        decoded = self.task.decode(examples, features, self.task_outputs(self.task, features))
        return [{**{k: v for k, v in d.items() if k != "id"}, "truncated": plan.truncated, "windows": len(plan.spans)}
                for d, plan in zip(decoded, plans)]

    @staticmethod
    def _tokens_read(plan: Any) -> int:
        """Distinct tokens of an input that its windows read, specials included."""
        read = {position for start, size in plan.spans for position in range(start, start + size)}
        return len(read) + plan.first_kept + (3 if plan.is_pair else 2)

    def rerank(self, queries: Sequence[str], texts: Sequence[str], truncate: bool = True,
               truncation_direction: str = "right", raw_scores: bool = False) -> list[float]:
        """One relevance score per (query, text) pair, encoded as `classify` encodes a pair: a one-output
        model's value (through a sigmoid where `sigmoid_scores`), else the probability of the second label;
        `raw_scores`: the value, or the second label's logit, with no sigmoid or softmax."""
        if "rerank" not in self.endpoints:
            raise BertkitError(f"this classifier has {len(self.labels or [])} labels; reranking needs a model with "
                               "one output or two labels")
        features, _ = self.encode(queries, texts, truncate, truncation_direction)
        if not features:
            return []
        logits = np.stack(self.task_outputs(self.task, features)["logits"]).astype(np.float64)  # (N, labels)
        if logits.shape[1] == 1:
            values = logits[:, 0]
            scores = 1 / (1 + np.exp(-values)) if self.sigmoid_scores and not raw_scores else values
        elif raw_scores:
            scores = logits[:, -1]
        else:
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            scores = shifted[:, -1] / shifted.sum(axis=1)
        return [float(score) for score in scores]

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        s = self.task.settings
        if s.long_documents == "windows":
            info["long_documents"] = {"mode": "windows", "doc_stride": s.doc_stride,
                                      "window_aggregation": s.window_aggregation, "max_windows": s.max_windows}
        return info

    def warmup(self) -> None:
        super().warmup()
        self.classify(["warm up"])


class TaggingPredictor(TaskPredictor):
    """Entities with character spans: words tagged by their first sub-token, long texts in windows."""

    task_class = TaggingTask
    endpoints = ("tag", "embed")
    task: TaggingTask

    def tag(self, texts: Sequence[str]) -> list[list[dict[str, Any]]]:
        """Per text, its entities {entity, text, start, end, score} in order; `text[start:end]` is the
        entity and `score` the mean probability of the predicted tags of its words."""
        sentences, spans = self.sentences(texts)
        if not sentences:
            return []
        features = self.task.features(sentences, self.tokenizer)
        outputs = self.task_outputs(self.task, features)  # logits: per feature (T_i, num_labels)
        tags = self.task.decode(sentences, features, outputs)
        confidence = _word_confidence(sentences, features, outputs["logits"])
        return [self._entities(t, s, w, c) for t, s, w, c in zip(texts, spans, tags, confidence)]

    def sentences(self, texts: Sequence[str]) -> tuple[list[TaggedSentence], list[list[tuple[int, int]]]]:
        """The texts split into words as the tokenizer splits them, and each word's character span."""
        spans = [self._word_spans(e) for e in self.tokenizer.encode_batch(texts, truncation=False)]
        sentences = [TaggedSentence([t[a:b] for a, b in s], None, f"inputs[{i}]")
                     for i, (t, s) in enumerate(zip(texts, spans))]
        return sentences, spans

    @staticmethod
    def _word_spans(encoding: Any) -> list[tuple[int, int]]:
        """Character span of each word (as the tokenizer splits words: whitespace and punctuation)."""
        spans: dict[int, tuple[int, int]] = {}
        for word, (start, end) in zip(encoding.word_ids, encoding.offsets):
            if word is not None:
                first = spans.get(word, (start, end))
                spans[word] = (min(first[0], start), max(first[1], end))
        return [spans[w] for w in sorted(spans)]

    @staticmethod
    def _entities(text: str, spans: list[tuple[int, int]], tags: list[str], confidence: list[float],
                  ) -> list[dict[str, Any]]:
        entities = []
        for entity_type, first, last in sorted(entities_conlleval(tags), key=lambda e: e[1]):
            start, end = spans[first][0], spans[last][1]
            entities.append({"entity": entity_type, "text": text[start:end], "start": start, "end": end,
                             "score": float(np.mean(confidence[first:last + 1]))})
        return entities

    def warmup(self) -> None:
        super().warmup()
        self.tag(["warm up"])


def _word_confidence(sentences: Sequence[TaggedSentence], features: Sequence[dict],
                     logits: Sequence[np.ndarray]) -> list[list[float]]:
    """Probability of the predicted tag of every word, read where TaggingTask.decode reads the tag."""
    confidence = [[0.0] * len(s.words) for s in sentences]
    for feature, rows in zip(features, logits):
        for position, word in enumerate(feature["word_positions"]):
            if word is not None:
                row = rows[position] - rows[position].max()
                confidence[feature["sentence_index"]][word] = float(1.0 / np.exp(row).sum())
    return confidence


class QuestionAnsweringPredictor(TaskPredictor):
    """Extractive QA over contexts of any length (doc-stride windows), with no-answer for v2.0 models."""

    task_class = SquadTask
    endpoints = ("answer", "embed")
    task: SquadTask

    def answer(self, questions: Sequence[str], contexts: Sequence[str]) -> list[dict[str, Any]]:
        """Per (question, context): {answer, score, start, end, no_answer}; `context[start:end]` is the
        answer, whole words (SquadTask.decode widens a span to the words it touches). v2.0 models answer
        "" (start/end None) when the null score beats the best span by more than
        `null_score_diff_threshold` from bertkit_task.json."""
        if len(questions) != len(contexts):
            raise BertkitError(f"got {len(questions)} questions but {len(contexts)} contexts; pass one context each")
        examples = [SquadExample(str(i), q, c, (), False) for i, (q, c) in enumerate(zip(questions, contexts))]
        if not examples:
            return []
        features = self.task.features(examples, self.tokenizer)
        decoded = self.task.decode(examples, features, self.task_outputs(self.task, features))
        return [self._result(e, decoded) for e in examples]

    def _result(self, example: SquadExample, decoded: dict[str, dict]) -> dict[str, Any]:
        text = decoded["predictions"][example.qid]
        nbest = decoded["nbest"][example.qid]
        entry = next((e for e in nbest if e["text"] == text), nbest[0])
        span = (entry["start_char"], entry["end_char"]) if text and entry["start_char"] is not None else None
        result: dict[str, Any] = {"answer": text if span else "", "score": entry["probability"],
                                  "start": span[0] if span else None, "end": span[1] if span else None,
                                  "no_answer": span is None}
        if self.task.settings.version_2_with_negative:
            result["null_score_diff"] = decoded["null_odds"][example.qid]
        return result

    def warmup(self) -> None:
        super().warmup()
        self.answer(["warm up?"], ["warm up"])


# --- loading ---------------------------------------------------------------------------------------

TASK_PREDICTORS: dict[str, type[TaskPredictor]] = {
    cls.task_class.kind: cls for cls in (ClassificationPredictor, TaggingPredictor, QuestionAnsweringPredictor)}
"""Task kind -> its predictor; a kind without one (multiple choice) is served for `embed` only."""


def load_predictor(settings: ServeSettings | str | Path, batch_size: int = 32,
                   long_documents: LongDocumentSettings | None = None) -> Predictor:
    """The predictor of `settings.model` (a path: `ServeSettings(model=path)`'s defaults), built complete; see
    the module docstring for the choice. `settings.precision` is an inference precision
    (`bertkit.model.for_inference`): fp32 exact, bf16 (results within bf16 rounding), int8 (encoder layers
    quantized, `settings.calibration` a sample of inputs for its SmoothQuant scales), or auto (the faster of fp32
    and bf16 as measured here); `settings.tokenizer` a tokenizer directory to use instead of the model's;
    `batch_size` the most inputs of one forward; `long_documents` the choices that replace a classifier's saved
    ones."""
    if not isinstance(settings, ServeSettings):
        settings = ServeSettings(Path(settings))
    apply_threads(settings.threads)
    directory = check_model_directory(settings.model)
    check_inference_precision(settings.precision)
    keep_freed_memory()  # the process reuses large activations from here on (bertkit.runtime.allocator)
    config = BertConfig.from_json_file(directory / "config.json")
    saved = read_task_file(directory)
    architecture = (config.architectures or ["BertModel"])[0]
    kind = saved["task"] if saved else kind_of_architecture(architecture) or (
        "fill-mask" if architecture in FILL_MASK_HEADS else "embed")
    choices = long_documents.long_document_choices() if long_documents else {}
    accepted = TASK_CLASSES[kind].column_settings if kind in TASK_CLASSES else ()
    refuse_columns(kind, {name: value for name, value in choices.items() if name not in accepted})
    precision = (settings.precision, settings.calibration)
    if kind in TASK_PREDICTORS:
        return _task_predictor(directory, config, saved is not None, TASK_PREDICTORS[kind], batch_size, precision,
                               settings.tokenizer, choices)
    tokenizer = WordPieceTokenizer.from_pretrained(settings.tokenizer or directory)
    check_model_vocabulary(tokenizer, config.vocab_size, directory, settings.tokenizer)
    sentence = read_sentence_transformers(directory)  # None unless a sentence-transformers directory
    max_seq_length = int((saved or {}).get("max_seq_length", (sentence and sentence.max_seq_length) or 512))
    fill_mask = kind == "fill-mask"
    model, resolved = _for_inference(_load(directory, architecture if fill_mask else "BertModel"), precision,
                                     directory, tokenizer, max_seq_length)
    return (FillMaskPredictor if fill_mask else Predictor)(model, tokenizer, max_seq_length, batch_size, sentence,
                                                           ModelInfo(kind, directory.name, resolved,
                                                                     directory_trained_positions(directory)))


def _task_predictor(directory: Path, config: BertConfig, saved: bool, predictor_class: type[TaskPredictor],
                    batch_size: int, precision: tuple[str, Path | None], tokenizer_dir: Path | None,
                    choices: dict[str, Any]) -> Predictor:
    """The predictor of a fine-tuned directory (bertkit_task.json), or of a task model fine-tuned elsewhere
    (its task read from config.json, and the length a CrossEncoder keeps in tokenizer_config.json)."""
    stand_in = None if saved else predictor_class.task_class.from_config(
        config, cross_encoder_length(directory, config.max_position_embeddings), source=str(directory / "config.json"))
    task, model, tokenizer = load_finetuned(directory, task=stand_in, tokenizer_dir=tokenizer_dir)
    model, resolved = _for_inference(model, precision, directory, tokenizer, task.settings.max_seq_length)
    if choices:
        task = task.with_columns(**choices)
    return predictor_class.of_directory(model, tokenizer, task, batch_size, ModelInfo(task.kind, directory.name,
                                                                                      resolved), directory, saved)


def _for_inference(model: torch.nn.Module, precision: tuple[str, Path | None], directory: Path,
                   tokenizer: WordPieceTokenizer, max_length: int) -> tuple[torch.nn.Module, str]:
    """`bertkit.model.for_inference` for (precision, calibration), keeping what 'auto' resolved to (/info says);
    int8's calibration sample is cut at `max_length`, as the predictor cuts inputs."""
    resolved = inference_precision(precision[0], model, torch.device("cpu"))
    smoothing = int8_smoothing(model, directory, precision[1], tokenizer, max_length) if resolved == "int8" else None
    return accelerate_for_inference(model, resolved, smoothing=smoothing), resolved


def _load(directory: Path, architecture: str) -> torch.nn.Module:
    if architecture not in MODEL_CLASSES:
        raise BertkitError(f"{directory}/config.json: unknown architecture {architecture!r}; "
                           f"expected one of {', '.join(MODEL_CLASSES)}")
    return load_weights(directory, MODEL_CLASSES[architecture])
