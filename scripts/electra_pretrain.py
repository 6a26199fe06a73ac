"""A screened pre-training lever: replaced-token detection (ELECTRA, Clark et al. 2020) in place of masked LM.

    python scripts/electra_pretrain.py --data DATA --tokenizer VOCAB --model bert-mini --recipe auto \
        --max-steps 1600 --threads 2 --seed 2 --output RUN

runs `bertkit pretrain` with those arguments (its plan, recipe, data, schedule, precision and checkpoints), except
the objective. A small generator - the model's depth at a quarter of its width (at least 64 wide), its own embeddings,
its decoder bias at the unigram frequencies as the recipe starts a masked LM - learns masked LM on the positions the
data selects; one sample of its prediction replaces each of them; the model itself (the discriminator, the one kept
in RUN/final and fine-tuned) learns, for every real token, whether it was replaced. The loss is the generator's
mean masked-LM cross-entropy plus 50 times the discriminator's mean binary cross-entropy (the paper's weight).
The paper gets more from a small budget this way because every token, not 15% of them, teaches the model; its
generator sees BERT's 80/10/10 corruption here (the data's), where the paper masks 85% and keeps 15%.

The held-out metrics printed during the run are the generator's masked LM. Every saved directory, checkpoints and
RUN/final, holds the discriminator as a BertForMaskedLM directory (its masked-LM head never trained; fine-tuning
does not read it) and the generator and the discriminator's head beside it (electra.pt), so a run resumes exactly;
the run's identity names the generator, so neither this script nor `bertkit pretrain` resumes the other's run (after
an interrupt, run this script's own command again with --resume auto; the stop message names `bertkit pretrain`).
Fresh single-process runs only. It is a study script, not a bertkit option: given the recipe's 10 CPU-minutes
(1,600 of its steps, 0.607 times the recipe's step rate) on two long-input families, the discriminator never left
the prior (it answers "not replaced" everywhere, with nearly one vector for every token) and fine-tuned 4.0 and 27.9
points below today's recipe (docs/pretraining.md, "Replaced-token detection, screened").
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from pretrain_extras import keep_beside
from torch import nn
from torch.nn import functional as F

from bertkit.cli import main
from bertkit.model import BertForMaskedLM
from bertkit.tasks.pretraining import IGNORE_INDEX
from bertkit.workflows import pretrain

RTD_WEIGHT = 50.0
GENERATOR_WIDTH_SHARE = 4
EXTRA_FILE = "electra.pt"


class ReplacedTokenHead(nn.Module):
    """hidden -> dense -> GELU -> one logit per token: was it replaced (the paper's discriminator head)."""

    def __init__(self, hidden_size: int, initializer_range: float) -> None:
        super().__init__()
        self.dense, self.out = nn.Linear(hidden_size, hidden_size), nn.Linear(hidden_size, 1)
        for layer in (self.dense, self.out):
            nn.init.normal_(layer.weight, std=initializer_range)
            nn.init.zeros_(layer.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.dense(hidden))).squeeze(-1)


def generator_config(config: Any) -> Any:
    """The discriminator's config at a quarter of its width (at least 64, at most its own), one head per 64
    dimensions."""
    hidden = min(config.hidden_size, max(64, config.hidden_size // GENERATOR_WIDTH_SHARE))
    return config.replace(hidden_size=hidden, num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden)


def _core(model: nn.Module) -> nn.Module:
    if hasattr(model, "module"):
        raise SystemExit("electra_pretrain: single-process runs only (it reaches past the DDP wrapper)")
    return model


class ReplacedTokenObjective:
    """The generator's MLM averaged over the selected tokens of the global batch, plus RTD_WEIGHT times the
    discriminator's binary cross-entropy averaged over its real tokens (`bertkit.train.loop.Objective`)."""

    def counts(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "mlm_labels" not in batch:
            raise SystemExit("electra_pretrain: the per-batch-shape step only (a CPU run's); not a static GPU step")
        return {"mlm": (batch["mlm_labels"] != IGNORE_INDEX).sum(), "rtd": batch["attention_mask"].sum()}

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor], totals: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model = _core(model)
        labels, types_, attention = batch["mlm_labels"], batch["token_type_ids"], batch["attention_mask"]
        selected = labels != IGNORE_INDEX
        logits = model.electra_generator(batch["input_ids"], types_, attention, masked_positions=selected).logits
        targets = labels[selected]
        mlm_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
        with torch.no_grad():
            sampled = torch.multinomial(F.softmax(logits.float(), -1), 1).squeeze(-1)
            original = torch.where(selected, labels, batch["input_ids"])
            corrupted = original.clone()
            corrupted[selected] = sampled
            replaced = (corrupted != original).float()
        hidden = model.bert(corrupted, types_, attention).last_hidden_state
        real = attention.bool()
        rtd_logits = model.electra_head(hidden).float()[real]
        rtd_sum = F.binary_cross_entropy_with_logits(rtd_logits, replaced[real], reduction="sum")
        mlm_loss, rtd_loss = mlm_sum / totals["mlm"], rtd_sum / totals["rtd"]
        said_replaced = (rtd_logits > 0).float()
        metrics = {"mlm_loss": mlm_loss.detach(),
                   "mlm_accuracy": (logits.argmax(-1) == targets).sum() / totals["mlm"],
                   "rtd_loss": rtd_loss.detach(),
                   "rtd_accuracy": (said_replaced == replaced[real]).sum() / totals["rtd"],
                   "replaced": replaced[real].sum() / totals["rtd"]}
        return mlm_loss + RTD_WEIGHT * rtd_loss, metrics


EXTRAS = ("electra_generator", "electra_head")


_build_model = pretrain.build_model
_unigram_start = pretrain._unigram_start
_evaluate_pretraining = pretrain.evaluate_pretraining
_run_identity = pretrain.run_identity


def _build_discriminator(settings, train, tokenizer, max_seq_length, step=None):
    """bertkit's fresh masked-LM-only model, with the generator and the replaced-token head attached."""
    model = _build_model(settings, train, tokenizer, max_seq_length, step)
    if settings.init_from is not None or not isinstance(model, BertForMaskedLM):
        raise SystemExit("electra_pretrain: a fresh masked-LM-only model only (no --init-from, no --nsp)")
    model.electra_generator = BertForMaskedLM(generator_config(model.config))
    model.electra_head = ReplacedTokenHead(model.config.hidden_size, model.config.initializer_range)
    keep_beside(model, EXTRAS, EXTRA_FILE, "electra_pretrain")
    return model


def _start_generator_bias(settings, model, train_set, evaluated, tokenizer, seed, ctx):
    """The run's own start, then the generator's decoder bias at the unigram frequencies (the recipe's start)."""
    baseline = _unigram_start(settings, model, train_set, True, tokenizer, seed, ctx)
    pretrain.start_bias_at_frequencies(model.electra_generator, baseline)
    return baseline if evaluated else None


def _evaluate_generator(model, *args, **kwargs):
    return _evaluate_pretraining(_core(model).electra_generator, *args, **kwargs)


def _identity_with_generator(settings, data, model, held_out):
    """bertkit's run identity, its model naming the generator too: resuming across the two objectives is refused by
    the resume rulebook, as any change of model."""
    identity = _run_identity(settings, data, model, held_out)
    generator = model.electra_generator.config
    identity["model"] += (f" + replaced-token detection (generator L={generator.num_hidden_layers} "
                          f"H={generator.hidden_size}, weight {RTD_WEIGHT:g})")
    return identity


PATCHES = {"build_model": _build_discriminator, "_unigram_start": _start_generator_bias,
           "_objective": lambda settings, step: ReplacedTokenObjective(),
           "evaluate_pretraining": _evaluate_generator, "run_identity": _identity_with_generator}
"""What this script replaces in `bertkit.workflows.pretrain` (the rest of the run is bertkit's)."""


if __name__ == "__main__":
    for name, patched in PATCHES.items():
        setattr(pretrain, name, patched)
    sys.exit(main(["pretrain", *sys.argv[1:]]))
