"""torchrun / DistributedDataParallel set-up: who am I, which device, and the few collectives the loop needs.

Design decision: a run is distributed exactly when torchrun's environment variables (`RANK`,
`WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) are present, one process included (torchrun
--nproc-per-node 1 joins a group of one, so its collectives run for real); the same code path then serves
one CPU process, several CPU processes (gloo) and many GPUs over many nodes (NCCL), with multi-node
rendezvous left entirely to torchrun. Every collective here is a no-op outside a process group, so the
loop never branches on "am I distributed" except to wrap the model.

One process group per process: joined on first need and left when the process exits, never in between. A
command that trains several times in one process (`bertkit glue`, the quickstart, several seeds, a library
caller chaining pretrain and finetune) reuses it: a second `init_process_group` under torchrun reuses the
rendezvous store's keys while the old ones are still there (gloo: "connectFullMesh failed"; NCCL exchanges
its unique id through the same store).

Every question whose answer comes from a file, a clock or a measurement is asked on rank 0 and its answer
broadcast (`rank0_decides`): ranks that read the same path a moment apart can see different files (rank 0
writing it), and a rank that then skips a collective the others enter leaves them waiting forever.

Tensor collectives take tensors on the training device (`DistributedContext.device`): NCCL serves CUDA
tensors only, so a CPU tensor sent through it fails ("No backend type associated with device type cpu");
`all_reduce_sum` refuses a tensor on another device before it gets there.

References: PyTorch DDP tutorial and torchrun docs (https://pytorch.org/docs/stable/elastic/run.html).
"""

from __future__ import annotations

import atexit
import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from bertkit.errors import BertkitError
from bertkit.runtime.device import resolve_device

T = TypeVar("T")


@dataclass(frozen=True)
class DistributedContext:
    """Where this process sits in the job."""

    rank: int = 0
    """Global rank of this process (0 writes logs and checkpoints)."""
    local_rank: int = 0
    """Rank on this node; picks the CUDA device."""
    world_size: int = 1
    """Number of processes taking part."""
    device: torch.device = torch.device("cpu")
    """Device this process trains on (and the device of every tensor collective)."""
    in_group: bool = False
    """Whether this process joined a process group (torchrun), even a group of one."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or self.in_group


def setup_distributed(device: str = "auto") -> DistributedContext:
    """This process's place in the torchrun job described by the environment (gloo on CPU, NCCL on CUDA), or
    alone. The process group is joined on the first call and kept until the process exits; later calls (the
    next training of a command that trains several times) reuse it."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1 and "RANK" not in os.environ:
        return DistributedContext(device=resolve_device(device))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    torch_device = resolve_device(device, local_rank)
    if torch_device.type == "cuda":
        torch.cuda.set_device(torch_device)
    backend = "nccl" if torch_device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                                device_id=torch_device if torch_device.type == "cuda" else None)
        atexit.register(teardown_distributed)
    elif dist.get_backend() != backend:
        raise BertkitError(f"--device {device}: this process already trains in a {dist.get_backend()} process "
                           f"group, and {torch_device.type} needs {backend}; one process group per process, so "
                           "give every training of this job the same --device")
    return DistributedContext(rank=rank, local_rank=local_rank, world_size=world_size, device=torch_device,
                              in_group=True)


def teardown_distributed() -> None:
    """Leave the process group (safe to call when none was joined): at the process's exit, or from a test that
    joined one.

    A DistributedDataParallel wrapper lives in a reference cycle, so it outlives the function that trained
    with it until the garbage collector runs; left for the interpreter's finalization, its C++ reducer was
    destroyed with a thread still running, and the process aborted ("terminate called without an active
    exception", SIGABRT) after a finished training in about 1 of 12 two-process gloo runs (torch 2.13), which
    torchrun reports as a failed job. Collecting it here, while the interpreter is whole, ended that (0 in 60)."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def wrap_model(model: nn.Module, ctx: DistributedContext) -> nn.Module:
    """DistributedDataParallel around `model` when there are several processes, else `model` itself."""
    if not ctx.distributed:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside a DDP wrapper."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def all_reduce_sum(tensor: torch.Tensor, ctx: DistributedContext) -> torch.Tensor:
    """Sum `tensor` (on the training device) over all processes, in place; returns it."""
    if not _same_device(tensor.device, ctx.device):
        raise ValueError(f"a collective got a tensor on {tensor.device}, but this process trains on {ctx.device}; "
                         "build it on the training device (NCCL serves no CPU tensors)")
    if ctx.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def _same_device(a: torch.device, b: torch.device) -> bool:
    """'cuda' and 'cuda:0' name the same device when the current device is 0."""
    if a.type != b.type:
        return False
    current = torch.cuda.current_device() if a.type == "cuda" else 0
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


def barrier(ctx: DistributedContext) -> None:
    if ctx.distributed:
        dist.barrier()


def all_gather_objects(obj: Any, ctx: DistributedContext) -> list[Any]:
    """Every process's `obj`, in rank order (in memory only; nothing is written with pickle)."""
    if not ctx.distributed:
        return [obj]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def rank0_decides(decide: Callable[[], T], ctx: DistributedContext) -> T:
    """`decide()` asked on rank 0 alone (a file read, a clock, a measurement) and its answer on every rank; an
    error it raises is raised on every rank (a BertkitError as it is; another error as itself on rank 0 and a
    RuntimeError naming it elsewhere), so none is left waiting in a collective the others skip."""
    answer: Any = None
    failure: BaseException | None = None
    if ctx.is_main:
        try:
            answer = decide()
        except BertkitError as exc:
            answer = exc
        except Exception as exc:  # noqa: BLE001  # shared with the other ranks, then raised here as it was
            failure, answer = exc, _RankZeroFailure(f"{type(exc).__name__}: {exc}")
    answer = broadcast_object(answer, ctx)
    if isinstance(answer, BertkitError):
        raise answer
    if isinstance(answer, _RankZeroFailure):
        if failure is not None:
            raise failure
        raise RuntimeError(f"rank 0 failed while deciding for every rank: {answer.text}")
    return answer


@dataclass(frozen=True)
class _RankZeroFailure:
    text: str


def broadcast_object(obj: Any, ctx: DistributedContext) -> Any:
    """Rank 0's `obj` on every process."""
    if not ctx.distributed:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
