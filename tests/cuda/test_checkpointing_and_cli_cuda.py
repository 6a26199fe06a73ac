"""Gradient checkpointing on the GPU (bf16 autocast, attention dropout: the CUDA RNG replayed in the
recompute gives the same loss and gradients), and the commands on CUDA: `bertkit pretrain` compiles the
encoder by default there, trains with --gradient-checkpointing and records the peak CUDA memory;
`bertkit finetune classification --gradient-checkpointing` trains and reports it."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
import torch

from bertkit.cli import main
from bertkit.data import InstanceSettings, build_pretraining_data, collate_pretraining
from bertkit.model import enable_gradient_checkpointing
from bertkit.settings import PretrainingDataSettings
from bertkit.tasks.pretraining import pretraining_loss
from bertkit.tokenizer import WordPieceTokenizer

from .conftest import DEVICE, cuda_only, cuda_or_cpu_check

pytestmark = [pytest.mark.cuda]


@cuda_or_cpu_check
def test_checkpointed_bf16_step_equals_the_plain_one():
    from gpu_check.tiny import pretraining_items, tiny_model

    plain = tiny_model().to(DEVICE).train()  # dropout 0.1 in the layers and in attention
    checkpointed = enable_gradient_checkpointing(copy.deepcopy(plain))
    batch = {k: v.to(DEVICE) for k, v in collate_pretraining(pretraining_items(8, 48)).items()}
    losses = []
    for model in (plain, checkpointed):
        torch.manual_seed(7)  # seeds the CUDA generator too: the same dropout masks for both
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = pretraining_loss(model, batch)[0]
        loss.backward()
        losses.append(float(loss.detach()))
    assert losses[0] == pytest.approx(losses[1], rel=1e-3)
    for (name, ours), theirs in zip(checkpointed.named_parameters(), plain.parameters(), strict=True):
        error = float((ours.grad - theirs.grad).norm() / theirs.grad.norm().clamp(min=1e-12))
        assert error < 1e-2, f"{name}: relative gradient error {error:.2e}"


def _corpus(path: Path) -> Path:
    words = "the a king said unto them and lord god people land day went came house hand earth".split()
    generator = torch.Generator().manual_seed(0)
    documents = []
    for _ in range(30):
        sentences = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (int(n),), generator=generator))
                     for n in torch.randint(4, 12, (5,), generator=generator)]
        documents.append("\n".join(sentences))
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


@cuda_only
def test_pretrain_compiles_by_default_on_cuda_and_checkpoints(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    corpus = _corpus(tmp_path / "corpus.txt")
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=100, min_frequency=1)
    tokenizer.save_pretrained(tmp_path / "tok")
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(tmp_path / "data"), workers=1, quiet=True,
        instances=InstanceSettings(max_seq_length=32, dupe_factor=2, max_predictions_per_seq=5)), tokenizer)
    caplog.set_level(logging.INFO)
    assert main(["pretrain", "--data", str(tmp_path / "data"), "--tokenizer", str(tmp_path / "tok"), "--model",
                 "bert-debug", "--output", str(tmp_path / "run"), "--batch-size", "8", "--max-steps", "4",
                 "--eval-examples", "8", "--device", "cuda", "--gradient-checkpointing"]) == 0
    assert "compiling the training step (the default on a GPU" in caplog.text
    step = json.loads((tmp_path / "run" / "pretrain_settings.json").read_text())["step"]
    assert step["static_shapes"] and step["compile"] and not step["fused_norm"]  # issue 49's step, by default
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records if r["kind"] == "train")
    memory = [r for r in records if r["kind"] == "memory"]
    assert memory and memory[0]["cuda_allocated_mib"] > 0


@cuda_only
def test_finetune_with_gradient_checkpointing_on_cuda(tmp_path: Path):
    words = "the film was good bad great awful a is fine".split()
    WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "."]).save_pretrained(tmp_path / "tok")
    rows = [f"the film was {w}\t{int(w in ('good', 'great', 'fine'))}" for w in ("good", "bad", "great", "awful") * 4]
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    assert main(["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(tmp_path / "tok"),
                 "--train", str(train), "--dev", str(train), "--task", "sst2", "--output", str(tmp_path / "out"),
                 "--epochs", "1", "--batch-size", "4", "--device", "cuda", "--max-seq-length", "16",
                 "--gradient-checkpointing"]) == 0
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert results["peak_memory"]["cuda_allocated_mib"] > 0
