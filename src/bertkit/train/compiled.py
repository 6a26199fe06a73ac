"""A training objective compiled whole: the model's forward, the heads and the loss as one torch.compile graph
(`fullgraph=True`, static shapes), its backward compiled with it by AOTAutograd, CUDA graphs as an option.

    objective = CompiledObjective(PretrainingObjective(), cuda_graphs=False)
    fit(model, objective, data, config, output)     # the loop calls it as any Objective

Design decision: the compiled region is the objective's call, not the model's layers, so the embeddings, every
layer, the heads and the loss are one graph with nothing between them for the host to launch one by one, and
nothing in it may read the device (a graph break would say so: `fullgraph=True` raises instead of splitting).
That holds for batches collated with static shapes (`bertkit.data.collate_static`): every batch of a run has
the same (B, T) and the same (B, P) prediction index, so `dynamic=False` compiles once; the one size that
varies, the number of real tokens of a padded batch (`token_indices`), is marked dynamic, so lengths never
compile again (a batch with padding and one without are two graphs, at most). With CUDA graphs (Inductor's
"reduce-overhead") the step's kernels are replayed from a recording; a graph with a dynamic size runs
without one (it would record again for every size).

Under DDP the wrapper's own forward must run as it is (it prepares the gradient all-reduce that overlaps the
backward), and Dynamo cannot trace it inside a larger graph: there the DDP module is compiled instead
(`torch.compile(ddp_model)`, the documented way: DDP's forward stays eager, the model inside is compiled, split
at the gradient buckets by Dynamo's DDP optimizer) and the loss runs eagerly around it.

References: JonasGeiping/cramming (the whole step compiled with static shapes, CUDA graphs); torch.compile's
documentation on `mark_dynamic` and CUDA graph trees.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from bertkit.train.loop import Objective

DYNAMIC_SIZES = ("token_indices",)
"""Batch keys whose first dimension varies from batch to batch (marked dynamic: one compilation for all sizes)."""


class CompiledObjective:
    """`objective` (an `Objective`: counts + call) with its call compiled whole; `counts` runs as it was (on
    the host batch). Compilation happens at the first call, so its time shows in the first step."""

    def __init__(self, objective: Objective, *, cuda_graphs: bool = False, backend: str = "inductor") -> None:
        """`backend`: torch.compile's; "aot_eager" traces the same graphs without generating code (the GPU
        check's dry run, tests that count graphs)."""
        self.objective, self.cuda_graphs = objective, cuda_graphs
        options: dict[str, Any] | None = None
        if cuda_graphs:
            options = {"triton.cudagraphs": True, "triton.cudagraph_skip_dynamic_graphs": True}
        self.compiled = torch.compile(objective.__call__, fullgraph=True, dynamic=False, backend=backend,
                                      options=options)
        self.compile_module = functools.partial(torch.compile, dynamic=False, backend=backend, options=options)
        self.compiled_ddp: dict[int, Any] = {}

    def counts(self, batch: Any) -> dict[str, torch.Tensor]:
        return self.objective.counts(batch)

    def __call__(self, model: nn.Module, batch: Any, totals: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        for key in DYNAMIC_SIZES:
            if isinstance(batch, dict) and isinstance(batch.get(key), torch.Tensor):
                torch._dynamo.mark_dynamic(batch[key], 0)
        if self.cuda_graphs:  # a new step: the outputs of the last replay may be overwritten now
            torch.compiler.cudagraph_mark_step_begin()
        if isinstance(model, nn.parallel.DistributedDataParallel):
            if id(model) not in self.compiled_ddp:
                self.compiled_ddp[id(model)] = self.compile_module(model)
            return self.objective(self.compiled_ddp[id(model)], batch, totals)
        return self.compiled(model, batch, totals)

    def __repr__(self) -> str:
        return f"CompiledObjective({type(self.objective).__name__}, cuda_graphs={self.cuda_graphs})"
