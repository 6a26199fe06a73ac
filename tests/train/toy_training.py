"""A toy regression task for the training-loop tests: small, with dropout so RNG state matters."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn


def toy_data(n: int = 20, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=generator)
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def toy_model(dropout: float = 0.2, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.Dropout(dropout), nn.Tanh(), nn.LayerNorm(16), nn.Linear(16, 1))


def toy_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
    return loss, {"mse": float(loss.detach())}


def train_losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["kind"] == "train"]
