"""Under torchrun the distillation loss trains one student: it runs the student through DDP's wrapper, so the
gradients (the width projection's too) are averaged over the processes, each rank holding the same ones."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("distill_ddp_worker.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_every_rank_holds_the_averaged_gradients() -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={_free_port()}",
               str(WORKER)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env={"OMP_NUM_THREADS": "1",
                          "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    gathered = reports[0]["grads"]  # [rank 0's, rank 1's] after the backward
    assert gathered[0] == gathered[1], gathered
