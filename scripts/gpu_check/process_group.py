"""Part 3, a one-rank process group driving the training loop's real reductions: NCCL on a GPU, gloo on
CPU in the dry run.

The runner starts this part with torchrun's variables for a job of one process (RANK=0, WORLD_SIZE=1,
LOCAL_RANK=0, MASTER_ADDR=127.0.0.1, MASTER_PORT=<a free port>). It calls `setup_distributed` the
documented way, checks one all-reduce on the training device, then runs `bertkit.train.fit` on a tiny
BertForPreTraining for 5 steps with an evaluation and a checkpoint at step 3 and at the end, and leaves
the group. Design decision: a group of one exercises every collective the loop makes (NCCL refuses CPU
tensors, so a collective on the wrong device fails here as it would on 8 GPUs) without a second GPU.
It passes only if a group was joined and the loop took the distributed path (`ctx.distributed`); a
`setup_distributed` that runs alone at WORLD_SIZE=1 is reported as a failure naming that.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import traceback
from pathlib import Path
from typing import Any

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
STEPS = 5


def run(options: dict[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    import torch
    import torch.distributed as dist

    from bertkit.data import collate_pretraining, collate_static
    from bertkit.kernels.cross_entropy import masked_lm_loss
    from bertkit.model.fused import fuse_for_training
    from bertkit.tasks.pretraining import PretrainingObjective, pretraining_loss
    from bertkit.train import Hooks, TrainConfig, TrainingData, fit, setup_distributed, teardown_distributed, wrap_model
    from bertkit.train import checkpoint as ckpt
    from bertkit.train.compiled import CompiledObjective
    from bertkit.workflows.pretrain import evaluate_pretraining
    from gpu_check.tiny import FIRST_WORD_ID, VOCAB_SIZE, pretraining_items, tiny_model

    device = "cpu" if options["dry_run"] else "cuda"
    details: dict[str, Any] = {"environment": {k: os.environ.get(k) for k in TORCHRUN_VARIABLES},
                               "requested_device": device}
    problems: list[str] = []
    ctx = setup_distributed(device)
    try:
        joined = dist.is_available() and dist.is_initialized()
        details.update(group_joined=joined, backend=dist.get_backend() if joined else None,
                       context={"rank": ctx.rank, "world_size": ctx.world_size, "device": str(ctx.device),
                                "distributed": ctx.distributed})
        print(f"setup_distributed({device!r}): group joined {joined}, backend {details['backend']}, "
              f"ctx.distributed {ctx.distributed}, device {ctx.device}", flush=True)
        if not joined:
            problems.append("setup_distributed joined no process group although torchrun's variables were set "
                            "(WORLD_SIZE=1); the loop's collectives were not exercised")
        elif not ctx.distributed:
            problems.append("a process group was joined but ctx.distributed is False, so the loop skips its "
                            "collectives")
        if joined:
            probe = torch.ones(2, device=ctx.device)
            dist.all_reduce(probe)
            details["all_reduce"] = probe.tolist()
        held_out = pretraining_items(16, seed=1)
        parameters = inspect.signature(evaluate_pretraining).parameters
        evaluate_kwargs: dict[str, Any] = {"ctx": ctx} if "ctx" in parameters else {}
        if "baseline" in parameters:  # the held-out context gain, its losses summed on the device
            from bertkit.workflows.pretrain import unigram_baseline

            evaluate_kwargs["baseline"] = unigram_baseline(pretraining_items(64), VOCAB_SIZE, range(FIRST_WORD_ID), 0)

        def eval_fn(model: torch.nn.Module) -> dict[str, float]:
            return evaluate_pretraining(model, held_out, 8, **evaluate_kwargs)

        precision = "bf16" if ctx.device.type == "cuda" else "fp32"
        config = TrainConfig(max_steps=STEPS, micro_batch_size=4, learning_rate=1e-3, precision=precision,
                             eval_every=3, save_every=3, log_every=1, seed=0)
        run_dir = Path(options["work"]) / "process-group-run"
        result = fit(wrap_model(tiny_model().to(ctx.device), ctx), pretraining_loss,
                     TrainingData(pretraining_items(64), collate_pretraining), config, run_dir, ctx=ctx,
                     hooks=Hooks(evaluate=eval_fn))
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in records if r.get("kind") == "train"]
        evals = [r for r in records if r.get("kind") == "eval"]
        saved = ckpt.list_checkpoints(run_dir / "checkpoints")
        details.update(precision=precision, steps=result.step, stop_reason=result.stop_reason,
                       skipped_steps=result.skipped_steps, train_losses=[r["loss"] for r in train],
                       evaluations=evals, checkpoints={p.name: ckpt.verify_checkpoint(p) or "valid" for p in saved})
        if result.step != STEPS or result.stop_reason != "budget":
            problems.append(f"fit stopped at step {result.step} ({result.stop_reason}), expected {STEPS} (budget)")
        if len(train) != STEPS or not all(math.isfinite(r["loss"]) for r in train):
            problems.append(f"train losses: {[r['loss'] for r in train]}")
        if not evals:
            problems.append("no evaluation was logged")
        elif "baseline" in evaluate_kwargs and not all(
                math.isfinite(r.get("mlm_context_gain", math.nan)) for r in evals):
            problems.append(f"held-out mlm_context_gain missing or not finite: {evals}")
        if not saved or any(ckpt.verify_checkpoint(p) for p in saved):
            problems.append(f"checkpoints: {details['checkpoints']}")
        # A second training in the same process and group, as `bertkit glue` and the quickstart run (issue 38):
        # setup_distributed reuses the group; a second init_process_group would fail (gloo) or hang (NCCL). It
        # runs issue 49's step through the real loop: static shapes, fused kernels, the whole objective compiled
        # (traced without code generation in the dry run), the statistics read every second step.
        again = setup_distributed(device)
        second_dir = run_dir.with_name("second-run")
        second = fit(wrap_model(fuse_for_training(tiny_model()).to(again.device), again),
                     CompiledObjective(PretrainingObjective(mlm_loss=masked_lm_loss),
                                       backend="aot_eager" if options["dry_run"] else "inductor"),
                     TrainingData(pretraining_items(64), functools.partial(collate_static, pad_token_id=0,
                                                                          max_seq_length=32, max_predictions=16),
                                  full_batches_only=True),
                     dataclasses.replace(config, read_every=2, eval_every=None, save_every=None), second_dir,
                     ctx=again)
        second_losses = [r["loss"] for r in map(json.loads, (second_dir / "metrics.jsonl").read_text().splitlines())
                         if r.get("kind") == "train"]
        details["second_training"] = {"steps": second.step, "stop_reason": second.stop_reason,
                                      "step": "static shapes, fused kernels, compiled objective, read every 2",
                                      "losses": second_losses}
        if second.step != STEPS or second.stop_reason != "budget" or len(second_losses) != STEPS \
                or not all(map(math.isfinite, second_losses)):
            problems.append(f"the second training in the same group (the compiled static step) stopped at step "
                            f"{second.step} ({second.stop_reason}), losses {second_losses}")
    except Exception:  # noqa: BLE001 - the error text is the result; what was found so far is kept
        problems.append(traceback.format_exc()[-3000:])
    finally:
        teardown_distributed()
    details["torn_down"] = not (dist.is_available() and dist.is_initialized())
    return ("failed" if problems else "passed"), details, "; ".join(problems) or None
