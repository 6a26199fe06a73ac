"""Worker for test_loop_ddp.py, run under torchrun: trains the toy task with DDP over gloo.

Usage: python -m torch.distributed.run --nproc-per-node N ddp_worker.py OUT MICRO ACCUM STEPS RESUME SIGTERM_AT
[READ_EVERY]
(RESUME is 'none' or 'auto'; SIGTERM_AT > 0 makes rank 0 send itself SIGTERM at that loss_fn call; READ_EVERY is
--read-every, 1 if not given.)
"""

from __future__ import annotations

import os
import signal
import sys

from toy_training import toy_data, toy_loss, toy_model

from bertkit.train import TrainConfig, fit, setup_distributed, teardown_distributed, wrap_model


def main(out: str, micro: str, accumulation: str, steps: str, resume: str, sigterm_at: str, read_every: str = "1"
         ) -> None:
    ctx = setup_distributed("cpu")
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        if ctx.is_main and calls["n"] == int(sigterm_at):
            os.kill(os.getpid(), signal.SIGTERM)
        return toy_loss(model, batch)

    config = TrainConfig(max_steps=int(steps), micro_batch_size=int(micro), learning_rate=1e-2, precision="fp32",
                         gradient_accumulation_steps=int(accumulation), save_every=100, log_every=1,
                         read_every=int(read_every))
    result = fit(wrap_model(toy_model(dropout=0.0), ctx), loss_fn, toy_data(24), config, out,
                 resume=None if resume == "none" else resume, ctx=ctx)
    print(f"rank {ctx.rank}: {result.stop_reason} at step {result.step}", flush=True)
    teardown_distributed()


if __name__ == "__main__":
    main(*sys.argv[1:])
