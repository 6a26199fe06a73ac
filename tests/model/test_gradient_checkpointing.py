"""Gradient checkpointing (`--gradient-checkpointing`): the same loss and gradients as without it (dropout
on, padded and full batches, masks replayed from the saved RNG state), far fewer tensors kept for the
backward, off in evaluation; the flag on `pretrain` and `finetune`; the peak memory each run reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertkit.cli import main
from bertkit.config import preset
from bertkit.model import BertForPreTraining, BertForSequenceClassification, enable_gradient_checkpointing
from bertkit.tokenizer import WordPieceTokenizer


def batch(padded: bool) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 120, (3, 16), generator=generator)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 10:] = 0
        mask[2, 4:] = 0
    labels = torch.full_like(ids, -100)
    labels[:, 2:5] = ids[:, 2:5]
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask, "labels": labels}


def loss_and_grads(checkpointing: bool, inputs: dict[str, torch.Tensor]
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = BertForPreTraining(preset("bert-debug", vocab_size=120)).train()  # dropout 0.1 on
    if checkpointing:
        enable_gradient_checkpointing(model)
    torch.manual_seed(3)  # the same dropout masks in both runs
    out = model(**{k: inputs[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    real = inputs["labels"] != -100
    loss = torch.nn.functional.cross_entropy(out.prediction_logits[real], inputs["labels"][real])
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_same_loss_and_gradients_with_dropout(padded: bool) -> None:
    inputs = batch(padded)
    loss, grads = loss_and_grads(False, inputs)
    loss_ckpt, grads_ckpt = loss_and_grads(True, inputs)
    torch.testing.assert_close(loss_ckpt, loss, rtol=0, atol=1e-6)
    assert grads.keys() == grads_ckpt.keys() and any("layers.1." in name for name in grads)
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], rtol=1e-5, atol=1e-6, msg=name)


def saved_bytes(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> int:
    """Bytes of the tensors autograd keeps for the backward during one forward."""
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(**{k: inputs[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    return total


def test_keeps_far_fewer_activations_and_is_off_in_evaluation() -> None:
    config = preset("bert-debug", vocab_size=120).replace(num_hidden_layers=6)
    torch.manual_seed(0)
    plain = BertForPreTraining(config).train()
    checkpointed = enable_gradient_checkpointing(BertForPreTraining(config).train())
    inputs = batch(padded=True)
    weights = sum(p.numel() * p.element_size() for p in plain.parameters())
    activations_plain = saved_bytes(plain, inputs) - weights
    activations_ckpt = saved_bytes(checkpointed, inputs) - weights
    assert activations_ckpt < activations_plain / 3, (activations_ckpt, activations_plain)
    with torch.no_grad():  # no recomputation without a backward: the output is the plain model's
        checkpointed.eval()
        plain.load_state_dict(checkpointed.state_dict())
        plain.eval()
        a = checkpointed(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        b = plain(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits)


def test_a_model_without_an_encoder_is_refused() -> None:
    with pytest.raises(TypeError, match="no BertModel"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("vocab")
    words = "the film was good bad great awful a is fine".split()
    WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "."]).save_pretrained(directory)
    return directory


def test_finetune_flag_trains_and_reports_peak_memory(vocab: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [f"the film was {word}\t{int(word in ('good', 'great', 'fine'))}"
            for word in ("good", "bad", "great", "awful", "fine", "bad") * 2]
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    enabled = []
    original = BertForSequenceClassification.forward

    def spy(self, *args, **kwargs):
        enabled.append(self.bert.gradient_checkpointing)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BertForSequenceClassification, "forward", spy)
    argv = ["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(vocab), "--train", str(train),
            "--dev", str(train), "--task", "sst2", "--output", str(tmp_path / "out"), "--epochs", "1",
            "--batch-size", "4", "--learning-rate", "1e-3", "--precision", "fp32", "--device", "cpu",
            "--max-seq-length", "16", "--gradient-checkpointing"]
    assert main(argv) == 0
    assert enabled and all(enabled)
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert results["peak_memory"]["rss_mib"] > 50  # torch alone holds more than this


def test_pretrain_flag_is_accepted_and_the_run_records_its_peak_memory(tmp_path: Path, write_toy_corpus,
                                                                      capsys: pytest.CaptureFixture) -> None:
    from bertkit.data import InstanceSettings, build_pretraining_data
    from bertkit.settings import PretrainingDataSettings

    corpus = write_toy_corpus(tmp_path / "corpus.txt", documents=12, sentences=(2, 5), words=(4, 10))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=100, min_frequency=1)
    tokenizer.save_pretrained(tmp_path / "tok")
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(tmp_path / "data"), workers=1, quiet=True,
        instances=InstanceSettings(max_seq_length=24, dupe_factor=1, max_predictions_per_seq=4)), tokenizer)
    assert main(["pretrain", "--data", str(tmp_path / "data"), "--tokenizer", str(tmp_path / "tok"), "--model",
                 "bert-debug", "--output", str(tmp_path / "run"), "--batch-size", "4", "--max-steps", "2",
                 "--eval-examples", "4", "--device", "cpu", "--gradient-checkpointing"]) == 0
    assert "peak memory: resident" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    memory = [r for r in records if r["kind"] == "memory"]
    assert len(memory) == 1 and memory[0]["step"] == 2 and memory[0]["rss_mib"] > 50
