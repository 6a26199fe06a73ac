"""A screened pre-training lever: the masked-LM decoder untied from the input word embeddings.

    python scripts/untied_decoder_pretrain.py --data DATA --tokenizer VOCAB --model bert-mini --recipe auto \
        --max-steps 2640 --threads 2 --seed 2 --output RUN

runs `bertkit pretrain` with those arguments (its plan, recipe, data, schedule, precision and checkpoints), except
that the masked-LM head scores words against a vocabulary matrix of its own (BERT's N(0, initializer_range²) start)
instead of the input word embeddings. BERT ties the two; RemBERT (Chung et al. 2021) measured decoupled input and
output embeddings transferring better. Here the reason to try it is the Treasury of David's diagnosis: the loss of
its short pre-trainings sat in the word embeddings the tied decoder had shaped (docs/pretraining.md, "Where the
Treasury's loss is"); untied, the input embeddings learn only what reading the input asks of them.

The decoder costs no more arithmetic (the same V x H product at the masked positions) and adds V x H parameters to
the optimizer. Every saved directory, checkpoints and RUN/final, holds the encoder and the head as a
BertForMaskedLM directory (its tied decoder never trained; fine-tuning does not read it) and the untied decoder beside
it (untied_decoder.pt), so a run resumes exactly; the run's identity names the decoder, so neither this script nor
`bertkit pretrain` resumes the other's run. Fresh single-process masked-LM-only runs only. It is a study script,
not a bertkit option: at 10 CPU-minutes (the recipe's 2,640 steps; its step rate is the recipe's) on two long-input
families it fine-tuned 1.7 and 1.5 points below today's recipe (docs/pretraining.md, "The masked-LM decoder untied
from the input embeddings, screened").
"""

from __future__ import annotations

import sys

import torch
from pretrain_extras import keep_beside
from torch import nn

from bertkit.cli import main
from bertkit.model import BertForMaskedLM
from bertkit.model.heads import MaskedLMHead
from bertkit.workflows import pretrain

EXTRA_FILE = "untied_decoder.pt"


class UntiedDecoder(nn.Module):
    """The masked-LM head's own (V, H) word matrix, started as BERT starts its embeddings."""

    def __init__(self, vocab_size: int, hidden_size: int, initializer_range: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size).normal_(0.0, initializer_range))


def untie(model: BertForMaskedLM) -> None:
    """Give `model`'s masked-LM head a decoder of its own (`model.untied_decoder`): the head then ignores the word
    embeddings it is handed (the same call everywhere, so training, evaluation and the inference copy agree), and
    the decoder is saved and loaded beside the model (`pretrain_extras.keep_beside`)."""
    config = model.config
    model.untied_decoder = UntiedDecoder(config.vocab_size, config.hidden_size, config.initializer_range)
    head, decoder = model.mlm, model.untied_decoder

    def forward(hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        return MaskedLMHead.forward(head, hidden, decoder.weight)

    head.forward = forward
    keep_beside(model, ("untied_decoder",), EXTRA_FILE, "untied_decoder_pretrain")


_build_model = pretrain.build_model
_run_identity = pretrain.run_identity


def _build_untied(settings, train, tokenizer, max_seq_length, step=None):
    """bertkit's fresh masked-LM-only model, its head's decoder untied."""
    model = _build_model(settings, train, tokenizer, max_seq_length, step)
    if settings.init_from is not None or not isinstance(model, BertForMaskedLM) or hasattr(model, "module"):
        raise SystemExit("untied_decoder_pretrain: a fresh single-process masked-LM-only model only "
                         "(no --init-from, no --nsp)")
    untie(model)
    return model


def _identity_untied(settings, data, model, held_out):
    """bertkit's run identity, its model naming the decoder: resuming across the two is refused by the rulebook."""
    identity = _run_identity(settings, data, model, held_out)
    identity["model"] += " + untied masked-LM decoder"
    return identity


PATCHES = {"build_model": _build_untied, "run_identity": _identity_untied}
"""What this script replaces in `bertkit.workflows.pretrain` (the rest of the run is bertkit's)."""


if __name__ == "__main__":
    for name, patched in PATCHES.items():
        setattr(pretrain, name, patched)
    sys.exit(main(["pretrain", *sys.argv[1:]]))
