"""Masked-LM-only instances (`bertkit data pretraining --no-nsp`): sentences packed up to --max-seq-length.

An instance is `[CLS] tokens... [SEP]`, one segment (token type 0), no NSP label. Where one document ends
and the next begins inside an instance, a [SEP] stands between them (RoBERTa's "extra separator token
between documents"); a document boundary that falls between two instances needs none. The modes
(`--packing`, `bertkit.settings.PACKINGS`):

- `full-sentences` (RoBERTa's FULL-SENTENCES, the default): whole sentences in corpus order, crossing
  document boundaries; a sentence that does not fit the room left starts the next instance. The room
  left is padding: about half a sentence per instance.
- `doc-sentences` (RoBERTa's DOC-SENTENCES): the same, but every document starts a new instance.
- `contiguous` (fairseq's break mode `none`, Hugging Face `run_mlm`'s `group_texts`): the token stream,
  with the [SEP]s between documents, cut every `max_seq_length - 2` tokens; a sentence that does not fit
  is split and continues in the next instance, so only a block's last instance has padding.

In every mode a sentence longer than a whole instance (`max_seq_length - 2` tokens) is split into
pieces of that length in order, the last piece followed by the next sentences as usual: every token of
the corpus is in exactly one instance of a pass, in order, and none is dropped. `PackStats` counts the
split sentences and the separators.

Design decision: packing is a fixed rule, with no random draw, so a block packs the same way in any
worker; the plan is one loop over the block's sentences (integers only, a few list appends per
sentence), and one vectorised gather builds the token ids, as `pretraining._assemble` does for pairs.
Packing never crosses a block boundary: each block of `--shuffle-buffer-mb` ends with one instance that
may be short.

References: Liu et al. 2019, RoBERTa (arXiv:1907.11692), section 4.2; fairseq `TokenBlockDataset`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FULL_SENTENCES, DOC_SENTENCES, CONTIGUOUS = "full-sentences", "doc-sentences", "contiguous"


@dataclass
class PackStats:
    """What packing did, summed into the data's summary."""

    sentences_across_instances: int = 0
    """Sentences cut across two or more instances (longer than an instance, or in `contiguous` mode)."""
    document_separators: int = 0
    """[SEP] tokens put between two documents inside an instance."""


@dataclass
class Packed:
    """Instances as the shards hold them."""

    ids: np.ndarray
    """(N,) token ids of all instances, concatenated."""
    lengths: np.ndarray
    """(n,) tokens per instance, [CLS] and [SEP]s included."""


def pack_instances(tokens: np.ndarray, sentence_offsets: np.ndarray, document_offsets: np.ndarray,
                   max_seq_length: int, mode: str, cls_id: int, sep_id: int, stats: PackStats) -> Packed:
    """Pack a block's sentences (sentence k is tokens[sentence_offsets[k]:sentence_offsets[k+1]], document d
    is sentences document_offsets[d]:document_offsets[d+1], none empty) into instances of at most
    `max_seq_length` tokens by `mode`."""
    if mode not in (FULL_SENTENCES, DOC_SENTENCES, CONTIGUOUS):
        raise ValueError(f"unknown packing {mode!r}")
    if len(sentence_offsets) < 2:  # no sentence: no instance (not an empty [CLS] [SEP])
        return Packed(tokens[:0], np.zeros(0, dtype=np.int64))
    first_in_document = np.zeros(len(sentence_offsets) - 1, dtype=bool)
    first_in_document[document_offsets[:-1]] = True
    source = np.concatenate([tokens, np.array([cls_id, sep_id], dtype=tokens.dtype)])
    starts, lengths, firsts = _plan(sentence_offsets, first_in_document, max_seq_length - 2, mode,
                                    len(tokens), stats)
    return Packed(_gather(source, starts, lengths), np.add.reduceat(lengths, firsts))


def _plan(sentence_offsets: np.ndarray, first_in_document: np.ndarray, room: int, mode: str, cls_at: int,
          stats: PackStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces every instance is made of, in order: (start in the source, length) of each piece, and the
    index of each instance's first piece. [CLS] is source position `cls_at`, [SEP] `cls_at + 1`."""
    sep_at = cls_at + 1
    starts, lengths, firsts = [cls_at], [1], [0]
    used = 0  # tokens in the open instance after its [CLS] (separators included); never above `room`
    whole = mode != CONTIGUOUS  # a sentence that does not fit moves to the next instance (else it is cut)
    for start, stop, first in zip(sentence_offsets[:-1].tolist(), sentence_offsets[1:].tolist(),
                                  first_in_document.tolist(), strict=True):
        length = stop - start
        separated = first and used > 0  # a new document inside the open instance
        # Close the open instance when it is full, when a document starts (doc-sentences), when only the
        # [SEP] before a new document would fit, or when a whole sentence is wanted and does not fit.
        if used and (used >= room or (first and mode == DOC_SENTENCES) or (separated and used + 1 >= room)
                     or (whole and used + separated + length > room)):
            starts += [sep_at, cls_at]
            lengths += [1, 1]
            firsts.append(len(starts) - 1)
            used, separated = 0, False
        if separated:
            starts.append(sep_at)
            lengths.append(1)
            used += 1
            stats.document_separators += 1
        stats.sentences_across_instances += int(used + length > room)
        while used + length > room:  # this instance takes what fits; the rest opens the next one
            take = room - used
            starts += [start, sep_at, cls_at]
            lengths += [take, 1, 1]
            firsts.append(len(starts) - 1)
            start, length, used = start + take, length - take, 0
        starts.append(start)
        lengths.append(length)
        used += length
    starts.append(sep_at)
    lengths.append(1)
    return np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64), np.asarray(firsts, dtype=np.int64)


def _gather(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The pieces (start, length) of `source`, concatenated: one fancy-index gather."""
    out_starts = np.cumsum(lengths) - lengths
    return source[np.repeat(starts - out_starts, lengths) + np.arange(int(lengths.sum()))]
