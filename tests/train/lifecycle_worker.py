"""Worker for test_torchrun_lifecycle.py, run under torchrun (gloo, CPU): one scenario per run.

Usage: python -m torch.distributed.run --nproc-per-node 2 lifecycle_worker.py SCENARIO OUT

- double-signal: every rank sends itself SIGTERM twice, 10 ms apart, in step 3 (as `srun torchrun` delivers the
  scheduler's and torchrun's); every rank must stop at step 3 with its checkpoint written.
- late-signal: rank 1 alone is signalled during the final evaluation, after the last step; every rank must
  report the stop (a caller must not start its next training on some ranks only).
- file-view: fine-tuning with --resume where rank 1 sees a finished-seed record that rank 0 does not (a file
  read a moment apart while rank 0 writes): rank 0 decides, so no rank skips the collectives of a seed.
Each rank prints "rank R: REASON at step S".
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from toy_training import toy_data, toy_loss, toy_model

from bertkit.train import Hooks, TrainConfig, fit, setup_distributed, wrap_model

CONFIG = dict(micro_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-2, precision="fp32",
              save_every=100, log_every=1)


def double_signal(out: Path) -> None:
    ctx = setup_distributed("cpu")
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        if calls["n"] == 5:  # step 3's first micro-batch
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)
        return toy_loss(model, batch)

    result = fit(wrap_model(toy_model(dropout=0.0), ctx), loss_fn, toy_data(24), TrainConfig(max_steps=6, **CONFIG),
                 out, ctx=ctx)
    print(f"rank {ctx.rank}: {result.stop_reason} at step {result.step}", flush=True)


def late_signal(out: Path) -> None:
    ctx = setup_distributed("cpu")

    def evaluate(model):
        if ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return {"zero": 0.0}

    result = fit(wrap_model(toy_model(dropout=0.0), ctx), toy_loss, toy_data(24), TrainConfig(max_steps=3, **CONFIG),
                 out, ctx=ctx, hooks=Hooks(evaluate=evaluate))
    print(f"rank {ctx.rank}: {result.stop_reason} at step {result.step}", flush=True)


def file_view(out: Path) -> None:
    from bertkit.data.glue import TextExample
    from bertkit.settings import ClassificationSettings, FinetuneSettings
    from bertkit.tasks.classification import ClassificationTask
    from bertkit.tokenizer import WordPieceTokenizer
    from bertkit.workflows import finetune, seeds

    ctx = setup_distributed("cpu")
    words = ["good", "bad", "film", "plot"]
    tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])
    if ctx.rank == 1:  # what rank 1 would read while rank 0 writes the marker: a seed finished
        stale = {"accuracy": 1.0, "step": 1}
        seeds.finished_seed = lambda seed_dir: stale  # type: ignore[assignment]
    examples = [TextExample(f"t:{i}", " ".join(words[(i + j) % 4] for j in range(3)), None, "good" if i % 2 else "bad")
                for i in range(16)]
    tokenizer.save_pretrained(out.parent / "vocab")
    settings = FinetuneSettings.of(model="bert-debug", tokenizer=str(out.parent / "vocab"), output=out, resume=True,
                                   num_epochs=1.0, global_batch_size=4, learning_rate=1e-3, precision="fp32",
                                   device="cpu")
    task = ClassificationTask(ClassificationSettings(labels=["bad", "good"], max_seq_length=16))
    results = finetune.finetune(task, settings, tokenizer, examples, [("", examples[:6])], {})
    print(f"rank {ctx.rank}: budget at step {results['step']}", flush=True)


if __name__ == "__main__":
    scenario, out = sys.argv[1], Path(sys.argv[2])
    {"double-signal": double_signal, "late-signal": late_signal, "file-view": file_view}[scenario](out)
