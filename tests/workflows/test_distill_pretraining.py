"""General distillation (`bertkit distill pretraining`): DistilBERT's objective checked against its definition on
dynamic and static batches, the command end to end (a student that `finetune` takes, its lineage), exact resume with
the objective in the run's identity, and the teachers and students it refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertkit.cli import main
from bertkit.config import preset
from bertkit.data import PretrainingDataset, build_pretraining_data, collate_pretraining
from bertkit.data.dataset import collate_static
from bertkit.errors import BertkitError
from bertkit.model import BertForMaskedLM
from bertkit.model.student import student_from_teacher
from bertkit.settings import InstanceSettings, PretrainingDataSettings
from bertkit.tasks.distillation import LossWeights, MaskedLMDistillation
from bertkit.tokenizer import WordPieceTokenizer


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, write_toy_corpus) -> dict[str, Path]:
    """Masked-LM data, its vocabulary, and a teacher pre-trained on it for a few steps."""
    root = tmp_path_factory.mktemp("general")
    corpus = write_toy_corpus(root / "corpus.txt", documents=40, sentences=(2, 8), words=(4, 14))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=120, min_frequency=1)
    tokenizer.save_pretrained(root / "tok")
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(root / "data"), workers=1, quiet=True,
        instances=InstanceSettings(max_seq_length=32, dupe_factor=2, max_predictions_per_seq=5, nsp=False)), tokenizer)
    assert main(["pretrain", "--data", str(root / "data"), "--tokenizer", str(root / "tok"), "--model", "bert-debug",
                 "--output", str(root / "teacher"), "--no-nsp", "--max-steps", "6", "--batch-size", "8",
                 "--learning-rate", "1e-3", "--eval-examples", "16", "--device", "cpu", "--recipe", "paper"]) == 0
    return {"root": root, "tok": root / "tok", "data": root / "data", "teacher": root / "teacher" / "final"}


def _distill(prepared, output: Path, *extra: str) -> int:
    return main(["distill", "pretraining", "--teacher", str(prepared["teacher"]), "--data", str(prepared["data"]),
                 "--output", str(output), "--batch-size", "8", "--learning-rate", "1e-3", "--eval-examples", "16",
                 "--eval-every", "3", "--device", "cpu", "--recipe", "paper", *extra])


def test_the_objective_is_distilberts_on_dynamic_and_static_batches(prepared) -> None:
    torch.manual_seed(0)
    teacher = BertForMaskedLM(preset("bert-debug", vocab_size=120).replace(num_hidden_layers=4)).eval()
    student = student_from_teacher(teacher, (0, 2)).eval()
    data = PretrainingDataset(prepared["data"])
    items = [data[i] for i in range(6)]
    dynamic = collate_pretraining(items)
    weights = LossWeights(soft=5.0, hard=2.0, hidden=1.0, temperature=2.0)
    objective = MaskedLMDistillation(teacher, weights)
    totals = {k: v.clamp(min=1) for k, v in objective.counts(dynamic).items()}
    loss, metrics = objective(student, dynamic, totals)
    masked = dynamic["mlm_labels"] != -100
    inputs = (dynamic["input_ids"], dynamic["token_type_ids"], dynamic["attention_mask"])
    s_out, t_out = student(*inputs, output_hidden_states=True), teacher(*inputs, output_hidden_states=True)
    s_logits, t_logits = s_out.logits[masked], t_out.logits[masked]
    soft = F.kl_div(F.log_softmax(s_logits / 2, -1), F.softmax(t_logits / 2, -1), reduction="batchmean") * 4
    mlm = F.cross_entropy(s_logits, dynamic["mlm_labels"][masked])
    real = dynamic["attention_mask"].bool()
    cosine = (1 - F.cosine_similarity(s_out.hidden_states[-1][real], t_out.hidden_states[-1][real], dim=-1)).mean()
    torch.testing.assert_close(loss, 5 * soft + 2 * mlm + cosine, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(metrics["soft_loss"], soft, rtol=1e-5, atol=1e-5)
    static = collate_static(items, 0, 32, 5)  # Google's listed positions, padding entries of weight 0
    static_totals = {k: v.clamp(min=1) for k, v in objective.counts(static).items()}
    assert int(static_totals["mlm"]) == int(totals["mlm"])
    static_loss, _ = objective(student, static, static_totals)
    torch.testing.assert_close(static_loss, loss, rtol=1e-4, atol=1e-4)
    whole = student_from_teacher(teacher, (0, 1, 2, 3)).eval()
    _, parts = objective(whole, dynamic, totals)
    assert float(parts["soft_loss"]) < 1e-6 and float(parts["cosine_loss"]) < 1e-5
    # what the checkpoints record of the last layer: in full where the cosine reads every state
    assert objective.last_layer is None
    assert MaskedLMDistillation(teacher, LossWeights(5.0, 2.0, 0.0, 2.0)).last_layer == "masked positions"


def test_general_distillation_end_to_end_and_resume(prepared, tmp_path) -> None:
    out = tmp_path / "student"
    assert _distill(prepared, out, "--max-steps", "6") == 0
    final = out / "final"
    lineage = json.loads((final / "distillation.json").read_text())
    assert lineage["student"] == "teacher layers 0" and (lineage["soft"], lineage["hard"]) == (5.0, 2.0)
    assert json.loads((final / "config.json").read_text())["num_hidden_layers"] == 1
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 6 and all({"soft_loss", "mlm_loss", "cosine_loss"} <= set(r) for r in train)
    assert main(["distill", "pretraining", "--teacher", str(prepared["teacher"]), "--data", str(prepared["data"]),
                 "--output", str(out), "--resume", "auto", "--max-steps", "8", "--temperature", "4", "--batch-size",
                 "8", "--learning-rate", "1e-3", "--eval-examples", "16", "--device", "cpu", "--recipe", "paper"]) != 0
    # the student is a pre-trained checkpoint fine-tuning takes
    train_file = tmp_path / "train.jsonl"
    train_file.write_text("".join(json.dumps({"text": t, "label": str(i % 2)}) + "\n"
                                  for i, t in enumerate(["a b c", "d e", "f g h", "i j"])))
    assert main(["finetune", "classification", "--model", str(final), "--train", str(train_file), "--output",
                 str(tmp_path / "ft"), "--epochs", "1", "--batch-size", "2", "--device", "cpu"]) == 0


def test_refused_teachers_and_students(prepared, tmp_path) -> None:
    from bertkit.settings import DistillSettings, PretrainSettings, TrainConfig
    from bertkit.workflows.distill_pretraining import distill_pretraining

    train = TrainConfig(max_steps=2, batch_size=8, learning_rate=1e-3, device="cpu")

    def run(**changes) -> None:
        distill_pretraining(PretrainSettings(data=str(prepared["data"]), model="bert-base",
                                             output=str(tmp_path / "x"), recipe="paper"), train,
                            DistillSettings(**{"teacher": prepared["teacher"], **changes}))
    with pytest.raises(BertkitError, match="cosine of last hidden states needs the student at the teacher's width"):
        run(student="bert-tiny", hidden_weight=1.0)
    classifier = tmp_path / "classifier"
    from bertkit.model import BertForSequenceClassification
    BertForSequenceClassification(preset("bert-debug", vocab_size=120)).save_pretrained(
        classifier, tokenizer=WordPieceTokenizer.from_pretrained(prepared["tok"]))
    with pytest.raises(BertkitError, match="no masked-LM head"):
        run(teacher=classifier)


def test_refusals_name_distills_own_flags(prepared, tmp_path, write_toy_corpus, capsys) -> None:
    """They named --tokenizer (which distill pretraining has not) or no flag at all."""
    corpus = write_toy_corpus(tmp_path / "other.txt", documents=10, sentences=(2, 4), words=(4, 8))
    other = WordPieceTokenizer.train([corpus], vocab_size=60, min_frequency=1)
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(tmp_path / "other"), workers=1, quiet=True,
        instances=InstanceSettings(max_seq_length=32, nsp=False)), other)
    other.save_pretrained(tmp_path / "vocab-only")
    other_data = {**prepared, "data": tmp_path / "other"}
    for inputs, extra, said in (
            (other_data, [], "--data .*other was made with another vocabulary than the teacher's"),
            (prepared, ["--student", str(tmp_path / "nowhere")], "--student .*nowhere: no such model directory"),
            (prepared, ["--student", str(tmp_path / "vocab-only")], "--student .*vocab-only: no config.json")):
        capsys.readouterr()
        assert _distill(inputs, tmp_path / "out", *extra, "--max-steps", "2") == 2
        assert re.search(said, capsys.readouterr().err)
        assert not (tmp_path / "out" / "student-init").exists()
