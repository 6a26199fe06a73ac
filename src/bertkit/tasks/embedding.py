"""Sentence embeddings as a task kind: a bi-encoder on (anchor, positive[, negative]) pairs with in-batch
negatives, scored by retrieval (what `bertkit finetune embedding` trains; the run is
`bertkit.workflows.embedding`).

    SentenceEncoder(bert, pooling, normalize)(input_ids, ...) -> (B, H)        BERT + pooling (+ normalize)
    multiple_negatives_ranking_loss(anchors, candidates, scale) -> loss
    pair_loss(scale): the training loop's loss over a (B, C, T) batch of pairs or triplets
    pair_features(pairs, tokenizer, max_seq_length) -> features, truncated
    retrieval_metrics(anchors, candidates, gold) -> recall@1/5/10, mrr@10; evaluate_retrieval over dev sets

The loss is sentence-transformers' MultipleNegativesRankingLoss: the anchors' cosine similarities to every
candidate of the micro-batch (all positives, then all hard negatives), times `scale` (20: temperature 0.05),
under a cross-entropy whose target for anchor i is positive i; every other pair's positive (and negative) is
a negative of anchor i. Retrieval is scored on each dev set: every anchor against all the set's distinct
positive texts by cosine similarity.

Design decision: not the `Task` protocol: a sentence encoder has no head and its evaluation compares examples
with each other. The pooling is `bertkit.inference.pooling`'s, the one `bertkit extract` and the server use,
so the vectors scored here are the vectors served.

References: Henderson et al. (2017), "Efficient Natural Language Response Suggestion for Smart Reply",
arXiv:1705.00652 (the loss); Reimers and Gurevych (2019), "Sentence-BERT", arXiv:1908.10084; van den Oord et
al. (2018), arXiv:1807.03748 (InfoNCE, the temperature).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertkit.data.pairs import PairExample
from bertkit.inference.batching import run_sorted
from bertkit.inference.pooling import sentence_vectors
from bertkit.model import BertModel
from bertkit.settings import EmbeddingSettings
from bertkit.tokenizer import WordPieceTokenizer

METRIC_NAMES = ("mrr@10", "recall@1", "recall@5", "recall@10")
"""Retrieval metrics of a dev set; the first selects the best evaluation."""
ANCHOR_BLOCK = 1024
"""Anchors scored against all candidates at a time (bounds the similarity matrix's memory)."""


# --- the model and the loss -------------------------------------------------------------------------------

class SentenceEncoder(nn.Module):
    """BERT, then one pooling of the last layer (mean / cls / max over the real tokens), then optionally unit
    length: sentence-transformers' Transformer, Pooling and Normalize modules."""

    def __init__(self, bert: BertModel, pooling: str, normalize: bool) -> None:
        super().__init__()
        self.bert, self.pooling, self.normalize = bert, pooling, normalize
        if bert.pooler is not None:  # unused here: frozen, so DistributedDataParallel expects no gradient for it
            bert.pooler.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, H) float32 sentence vectors."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        return sentence_vectors([hidden], attention_mask, (self.pooling,), self.normalize)


def multiple_negatives_ranking_loss(anchors: torch.Tensor, candidates: torch.Tensor, scale: float) -> torch.Tensor:
    """Cross-entropy of `scale` x cosine(anchor i, every candidate) (B, K*B) with target i: `anchors` (B, H),
    `candidates` (K*B, H), the B positives first (row i matches anchor i), then any hard negatives."""
    scores = scale * F.normalize(anchors, dim=-1) @ F.normalize(candidates, dim=-1).T  # (B, K*B)
    return F.cross_entropy(scores, torch.arange(len(anchors), device=scores.device))


def pair_loss(scale: float) -> Any:
    """The training loop's loss_fn: one forward over every text of a (B, C, T) batch of pairs (C = 2) or
    triplets (C = 3), the mean loss over its B anchors."""
    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        ids = batch["input_ids"]
        size, columns, length = ids.shape
        flat = [batch[key].reshape(size * columns, length) for key in ("input_ids", "token_type_ids",
                                                                        "attention_mask")]
        vectors = model(*flat).reshape(size, columns, -1)  # (B, C, H)
        candidates = vectors[:, 1:].transpose(0, 1).reshape(-1, vectors.shape[-1])  # positives, then negatives
        return multiple_negatives_ranking_loss(vectors[:, 0], candidates, scale), {}
    return loss


# --- features and retrieval -----------------------------------------------------------------------------

def _encoded(tokenizer: WordPieceTokenizer, texts: Sequence[str], max_seq_length: int) -> tuple[list[list[int]], int]:
    """([CLS] text [SEP] ids of each text cut to max_seq_length, how many were cut)."""
    encodings = tokenizer.encode_batch(list(texts), max_length=max_seq_length)
    return [e.input_ids for e in encodings], sum(e.truncated for e in encodings)


def pair_features(pairs: Sequence[PairExample], tokenizer: WordPieceTokenizer,
                  max_seq_length: int) -> tuple[list[dict[str, Any]], int]:
    """One feature per pair in the multiple-choice layout (C lists of tokens: anchor, positive[, negative]),
    and the number of texts truncated."""
    columns = [[p.anchor for p in pairs], [p.positive for p in pairs]]
    if pairs and pairs[0].negative is not None:
        columns.append([cast(str, p.negative) for p in pairs])
    encoded = [_encoded(tokenizer, texts, max_seq_length) for texts in columns]
    features = []
    for index in range(len(pairs)):
        ids = [column[index] for column, _ in encoded]
        features.append({"input_ids": ids, "token_type_ids": [[0] * len(i) for i in ids],
                         "attention_mask": [[1] * len(i) for i in ids]})
    return features, sum(cut for _, cut in encoded)


@dataclass
class DevPairs:
    """A --dev set: its anchors, its distinct positive texts (the candidates) and each anchor's one."""

    name: str
    """'' for the first --dev file, else the file's stem (prefix of its metrics)."""
    anchors: list[str]
    candidates: list[str]
    gold: np.ndarray
    """(N,) index into `candidates` of each anchor's positive."""

    @classmethod
    def of(cls, name: str, pairs: Sequence[PairExample]) -> DevPairs:
        index: dict[str, int] = {}
        gold = [index.setdefault(p.positive, len(index)) for p in pairs]
        return cls(name, [p.anchor for p in pairs], list(index), np.array(gold))


def encode_texts(model: nn.Module, tokenizer: WordPieceTokenizer, texts: Sequence[str], max_seq_length: int,
                 batch_size: int, device: torch.device) -> np.ndarray:
    """(N, H) float32 sentence vectors of `texts`, in length-sorted batches, in fp32 with gradients off."""
    ids, _ = _encoded(tokenizer, texts, max_seq_length)
    features = [{"input_ids": i, "token_type_ids": [0] * len(i), "attention_mask": [1] * len(i)} for i in ids]
    was_training = model.training
    model.eval()
    with torch.autocast(device.type, enabled=False):
        rows = run_sorted(features, lambda b: model(b["input_ids"], b["token_type_ids"], b["attention_mask"]),
                          batch_size, tokenizer.pad_token_id, device, grad_free=torch.no_grad)
    model.train(was_training)
    return torch.stack(rows).float().cpu().numpy() if rows else np.zeros((0, 0), np.float32)


def retrieval_metrics(anchors: np.ndarray, candidates: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Recall@1/5/10 and MRR@10 of ranking all `candidates` (K, H) for each of `anchors` (N, H) by cosine
    similarity, `gold` (N,) the index of each anchor's positive. A rank is 1 + the candidates scoring strictly
    higher than the positive (a tie counts for the positive)."""
    unit_anchors = anchors / np.maximum(np.linalg.norm(anchors, axis=1, keepdims=True), 1e-12)
    unit_candidates = candidates / np.maximum(np.linalg.norm(candidates, axis=1, keepdims=True), 1e-12)
    ranks = np.empty(len(anchors), dtype=np.int64)
    for start in range(0, len(anchors), ANCHOR_BLOCK):
        scores = unit_anchors[start:start + ANCHOR_BLOCK] @ unit_candidates.T  # (n, K)
        positive = scores[np.arange(len(scores)), gold[start:start + ANCHOR_BLOCK]]
        ranks[start:start + ANCHOR_BLOCK] = 1 + (scores > positive[:, None]).sum(axis=1)
    metrics = {"mrr@10": float(np.where(ranks <= 10, 1.0 / ranks, 0.0).mean())}
    metrics.update({f"recall@{k}": float((ranks <= k).mean()) for k in (1, 5, 10)})
    return metrics


def evaluate_retrieval(model: nn.Module, tokenizer: WordPieceTokenizer, dev_sets: Sequence[DevPairs],
                       settings: EmbeddingSettings, batch_size: int, device: torch.device) -> dict[str, float]:
    """The retrieval metrics of every dev set (those of the second and later prefixed with their name)."""
    metrics = {}
    for dev in dev_sets:
        anchors = encode_texts(model, tokenizer, dev.anchors, settings.max_seq_length, batch_size, device)
        candidates = encode_texts(model, tokenizer, dev.candidates, settings.max_seq_length, batch_size, device)
        for key, value in retrieval_metrics(anchors, candidates, dev.gold).items():
            metrics[f"{dev.name}_{key}" if dev.name else key] = value
    return metrics
