"""Reading a pre-training corpus as a stream of documents, with every bad input counted.

The reader itself is `bertkit.io.textlines` (`read_documents`, `CorpusStats`, `expand_inputs`), one layer
down, so that `bertkit tokenizer train` reads exactly the text `bertkit data pretraining` reads (the
"text" field of a JSONL file, never its keys; the "text" column of a Parquet file or `datasets`
directory); its formats and rules for bad input are documented there and in docs/formats.md. This
module re-exports them for the data layer and adds `split_sentences`, which splits paragraphs with
pysbd for text that is not one sentence per line.

References: google-research/bert `create_pretraining_data.py` (input format); pysbd
(Sadvilkar & Neumann 2020, "PySBD: Pragmatic Sentence Boundary Disambiguation").
"""

from __future__ import annotations

from functools import lru_cache

from bertkit.io.textlines import (
    MAX_DOCUMENT_BYTES,
    MAX_JSONL_LINE_BYTES,
    MAX_LINE_BYTES,
    CorpusStats,
    expand_inputs,
    plain_text_bytes,
    read_documents,
)

__all__ = ["MAX_DOCUMENT_BYTES", "MAX_JSONL_LINE_BYTES", "MAX_LINE_BYTES", "CorpusStats", "expand_inputs",
           "plain_text_bytes", "read_documents", "split_sentences"]


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd  # imported only when --split-sentences is used

    return pysbd.Segmenter(language="en", clean=False)


def split_sentences(lines: list[str]) -> list[str]:
    """Sentences of each line (a paragraph), by pysbd's English rules."""
    segmenter = _segmenter()
    return [s.strip() for line in lines for s in segmenter.segment(line) if s.strip()]
