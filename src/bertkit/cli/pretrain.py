"""`bertkit pretrain`: pre-train BERT with masked LM + next sentence prediction.

Flag parsing only: the flags become a `PretrainSettings` and a `TrainConfig` and go to
`bertkit.tasks.pretraining.pretrain`. `--recipe auto` (the default) fills the settings a budget decides
(sequence length, peak learning rate, warmup, dropout, masking rate, NSP, batch size) from the budget and
this machine's measured throughput (bertkit.tasks.recipes); each of them keeps the value of its own flag
when one is given, so those flags default to None here. The other defaults are the paper's (AdamW, betas
0.9/0.999, weight decay 0.01, clipping 1.0). Run it under `torchrun` for several processes, GPUs or nodes;
the flags stay the same (see docs/distributed.md).
"""

from __future__ import annotations

import logging
import re
import signal
from pathlib import Path

import click

from bertkit.cli.finetune import SCHEDULE_NAMES
from bertkit.errors import BertkitError, Interrupted

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


def parse_duration(text: str) -> float:
    """'2h', '90m', '1h30m', '45s' or a plain number of seconds -> seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    match = _DURATION.match(text.strip().lower())
    if not text.strip() or match is None or not any(match.groups()):
        raise BertkitError(f"--max-time {text!r}: expected a duration such as 2h, 90m, 1h30m, 45s or seconds")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


@click.command()
@click.option("--data", required=True, type=click.Path(file_okay=False), help="Directory written by `bertkit data pretraining`.")
@click.option("--model", default="bert-base", show_default=True,
              help="Preset name (bert-tiny, bert-mini, bert-small, bert-medium, bert-base, bert-large) or a config.json.")
@click.option("--output", required=True, type=click.Path(file_okay=False), help="Run directory (checkpoints, logs, final/).")
@click.option("--tokenizer", default=None, help="Directory with the vocab.txt the data was made with [default: --init-from's].")
@click.option("--init-from", default=None, type=click.Path(file_okay=False),
              help="Start from these weights (continued pre-training, or phase 2 at a longer --max-seq-length).")
@click.option("--max-steps", default=None, type=int, help="Optimizer steps to train for.")
@click.option("--max-time", default=None, help="Training time budget, e.g. 2h or 90m; the schedule follows it.")
@click.option("--recipe", default="auto", show_default=True, type=click.Choice(["auto", "paper", "short"]),
              help="auto: the paper's settings when the budget allows ~100,000 steps, else the short-budget recipe "
                   "(64 tokens, lr 5e-4 at bert-mini's width, 5% warmup, no dropout, 15% dynamic masking, NSP, "
                   "batch 32); the choice and its reason are printed; each setting's own flag overrides it.")
@click.option("--batch-size", default=None, type=int, help="Micro-batch size per process [default: the recipe's, 32].")
@click.option("--gradient-accumulation-steps", default=1, show_default=True, type=int,
              help="Micro-batches per optimizer step (global batch = batch size x this x processes).")
@click.option("--learning-rate", default=None, type=float,
              help="Peak learning rate [default: the recipe's: paper 1e-4, short 5e-4 x sqrt(256 / hidden size)].")
@click.option("--warmup-steps", default=None, type=int, help="Linear warmup steps [default: --warmup-ratio of --max-steps].")
@click.option("--warmup-ratio", default=None, type=float,
              help="Warmup as a fraction of the budget (of the time under --max-time alone) [default: the "
                   "recipe's: paper 0.01, short 0.05].")
@click.option("--lr-schedule", default="linear", show_default=True, type=click.Choice(list(SCHEDULE_NAMES)),
              help="Learning rate after the warmup: linear or cosine decay to 0 at the end of the budget, "
                   "constant, or inverse square root.")
@click.option("--weight-decay", default=0.01, show_default=True, type=float, help="Weight decay (not on biases and LayerNorm).")
@click.option("--adam-epsilon", default=1e-6, show_default=True, type=float,
              help="AdamW/LAMB epsilon (1e-6 as the original BERT optimizer).")
@click.option("--max-grad-norm", default=1.0, show_default=True, type=float, help="Gradient clipping norm (0: no clipping).")
@click.option("--optimizer", default="adamw", show_default=True, type=click.Choice(["adamw", "lamb"]),
              help="AdamW, or LAMB for very large batches.")
@click.option("--precision", default="auto", show_default=True, type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
              help="auto: the faster of fp32 and bf16 as measured on this machine (`bertkit doctor`; bf16 on GPUs "
                   "that support it); bf16 autocast (CPU or CUDA); fp16 autocast with a grad scaler (CUDA).")
@click.option("--dropout", default=None, type=float,
              help="Hidden and attention dropout while pre-training [default: the recipe's: paper the model "
                   "config's (0.1 in the presets), short 0].")
@click.option("--max-seq-length", default=None, type=int,
              help="Cut longer instances to this many tokens at load (Google's pair rule) [default: the recipe's: "
                   "paper the data's, short 64].")
@click.option("--masked-lm-prob", default=None, type=float,
              help="Masking rate of dynamically masked data [default: the recipe's, 0.15 (static data: its own)].")
@click.option("--compile", "compile_layers", is_flag=True,
              help="torch.compile the encoder layers (one-off compilation ~1 min); measured faster on shared CPU "
                   "cores, no gain on idle ones (docs/performance.md).")
@click.option("--nsp/--no-nsp", default=None,
              help="Next sentence prediction on/off (--no-nsp: masked LM only, the paper's ablation) [default: on].")
@click.option("--eval-every", default=500, show_default=True, type=int, help="Held-out evaluation every N steps (and at the end).")
@click.option("--eval-data", default=None, type=click.Path(file_okay=False),
              help="Held-out data directory [default: hold out --eval-examples of --data].")
@click.option("--eval-examples", default=1000, show_default=True, type=int,
              help="Instances held out of --data for evaluation when --eval-data is not given (at most a tenth).")
@click.option("--save-every", default=1000, show_default=True, type=int, help="Checkpoint every N steps (also on SIGTERM/SIGINT and at the end).")
@click.option("--keep-last", default=3, show_default=True, type=int, help="Checkpoints kept.")
@click.option("--resume", default=None, help="'auto' (newest valid checkpoint in --output) or a checkpoint directory.")
@click.option("--overwrite", is_flag=True, help="Delete the checkpoints of an earlier run in --output and start at step 0.")
@click.option("--log-every", default=10, show_default=True, type=int, help="Progress-bar refresh interval in steps.")
@click.option("--num-workers", default=0, show_default=True, type=int, help="DataLoader workers per process.")
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "cuda"]), help="Device.")
@click.option("--seed", default=42, show_default=True, type=int, help="Seed of initialisation, data order and dropout.")
def pretrain(**flags) -> None:
    """Pre-train BERT with masked LM + next sentence prediction on a `bertkit data pretraining` directory."""
    from bertkit.tasks.pretraining import PretrainSettings, pretrain as run_pretraining
    from bertkit.train import TrainConfig

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # The recipe's settings the user gave, by their PretrainSettings / TrainConfig field names.
    given = {"micro_batch_size": flags["batch_size"], "learning_rate": flags["learning_rate"],
             "warmup_ratio": flags["warmup_ratio"], "dropout": flags["dropout"], "nsp": flags["nsp"],
             "max_seq_length": flags["max_seq_length"], "masked_lm_prob": flags["masked_lm_prob"]}
    given = {name: value for name, value in given.items() if value is not None}
    settings = PretrainSettings(
        data=flags["data"], model=flags["model"], output=flags["output"], tokenizer=flags["tokenizer"],
        init_from=flags["init_from"], nsp=given.get("nsp", True), dropout=flags["dropout"],
        max_seq_length=flags["max_seq_length"], masked_lm_prob=flags["masked_lm_prob"], eval_data=flags["eval_data"],
        eval_examples=flags["eval_examples"], resume=flags["resume"], overwrite=flags["overwrite"],
        device=flags["device"], compile=flags["compile_layers"], recipe=flags["recipe"], given=tuple(given))
    config = TrainConfig(
        max_steps=flags["max_steps"],
        max_time_s=parse_duration(flags["max_time"]) if flags["max_time"] is not None else None,
        micro_batch_size=given.get("micro_batch_size", 32), gradient_accumulation_steps=flags["gradient_accumulation_steps"],
        learning_rate=given.get("learning_rate", 1e-4), warmup_steps=flags["warmup_steps"],
        warmup_ratio=given.get("warmup_ratio", 0.01), lr_schedule=flags["lr_schedule"], weight_decay=flags["weight_decay"],
        eps=flags["adam_epsilon"],
        max_grad_norm=flags["max_grad_norm"], optimizer=flags["optimizer"], precision=flags["precision"],
        seed=flags["seed"], num_workers=flags["num_workers"], log_every=flags["log_every"],
        eval_every=flags["eval_every"], save_every=flags["save_every"], keep_last=flags["keep_last"])
    result = run_pretraining(settings, config)
    if result.stop_reason == "signal":
        raise Interrupted(f"pre-training stopped by {signal.Signals(result.signal).name} at step {result.step}; "
                          f"saved {result.checkpoint}", result.signal, "--resume auto")
    if result.checkpoint is not None:
        click.echo(f"done: {result.step} steps ({result.skipped_steps} skipped as non-finite); "
                   f"model in {Path(flags['output']) / 'final'}")
