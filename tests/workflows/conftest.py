"""What the workflow tests share: a tiny randomly initialised BERT directory with a vocabulary of a few words."""

from __future__ import annotations

from pathlib import Path

from bertkit.config import preset
from bertkit.model import BertForPreTraining
from bertkit.tokenizer import WordPieceTokenizer

WORDS = ["good", "bad", "film", "plot", "great", "awful"]
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def tiny_model(directory: Path) -> Path:
    """bert-debug with random weights and the TOKENS vocabulary, saved as a checkpoint directory."""
    BertForPreTraining(preset("bert-debug", vocab_size=len(TOKENS))).save_pretrained(
        directory, tokenizer=WordPieceTokenizer(TOKENS))
    return directory
