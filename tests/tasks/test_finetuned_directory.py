"""The fine-tuned directory module and the Task protocol: every task is a `Task`, each feature-based head
round-trips through save_finetuned / load_finetuned, and generic code never asks which task it holds."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.model import BertModel
from bertkit.model.feature_based import FeatureBasedModel
from bertkit.tasks.finetuned import TASK_FILE, feature_based_model, load_finetuned, read_task_file, save_finetuned
from bertkit.tasks.kinds import TASK_CLASSES
from bertkit.tasks.task import Task
from bertkit.tokenizer import WordPieceTokenizer

SRC = Path(__file__).resolve().parents[2] / "src" / "bertkit"
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film", "who", "is"]


def _task(kind: str) -> Task:
    cls = TASK_CLASSES[kind]
    fields = {"labels": ["O", "B-PER", "I-PER"]} if kind in ("classification", "tagging") else {}
    return cls(cls.settings_class(**fields))


@pytest.mark.parametrize("kind", sorted(TASK_CLASSES))
def test_every_task_is_a_task_and_its_feature_based_model_round_trips(kind, tmp_path):
    task = _task(kind)
    assert isinstance(task, Task)
    torch.manual_seed(0)
    bert = BertModel(preset("bert-debug", vocab_size=len(VOCAB), **task.config_overrides()))
    model = feature_based_model(task, bert, (-1, 0), "concat", 0.0).eval()
    save_finetuned(model, task, WordPieceTokenizer(VOCAB), tmp_path / "best")
    loaded_task, loaded, tokenizer = load_finetuned(tmp_path / "best")
    assert isinstance(loaded, FeatureBasedModel) and loaded.layers == (-1, 0) and loaded.combine == "concat"
    assert loaded_task.to_json() == task.to_json() and tokenizer.vocab_size == len(VOCAB)
    ids = torch.tensor([[2, 5, 6, 7, 3], [2, 8, 9, 3, 0]])
    mask = (ids != 0).long()
    if kind == "multiple-choice":
        ids, mask = ids.unsqueeze(0), mask.unsqueeze(0)  # (1, C=2, T)
    with torch.no_grad():
        before, after = model(ids, torch.zeros_like(ids), mask), loaded(ids, torch.zeros_like(ids), mask)
    for name in task.output_names:
        torch.testing.assert_close(getattr(after, name), getattr(before, name), rtol=0, atol=0)
    shapes = {"classification": (2, 3), "tagging": (2, 5, 3), "squad": (2, 5), "multiple-choice": (1, 2)}
    assert tuple(getattr(before, task.output_names[0]).shape) == shapes[kind]  # where the head reads


def test_task_file_errors_name_the_file(tmp_path):
    assert read_task_file(tmp_path) is None
    with pytest.raises(BertkitError, match="no config.json, so not a model directory"):
        load_finetuned(tmp_path)  # the model directory is checked first
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(BertkitError, match="no bertkit_task.json"):
        load_finetuned(tmp_path)
    (tmp_path / TASK_FILE).write_text("{broken", encoding="utf-8")
    with pytest.raises(BertkitError, match="bertkit_task.json: not valid JSON"):
        read_task_file(tmp_path)
    (tmp_path / TASK_FILE).write_text(json.dumps({"task": "summarization"}), encoding="utf-8")
    with pytest.raises(BertkitError, match="unknown task 'summarization'"):
        load_finetuned(tmp_path)


@pytest.mark.parametrize("module", ["workflows/finetune.py", "workflows/predict.py", "tasks/finetuned.py",
                                    "inference/batching.py"])
def test_generic_code_never_asks_which_task_it_holds(module):
    """Fine-tuning, evaluation and the directory format reach tasks through the `Task` protocol only."""
    tree = ast.parse((SRC / module).read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    task_modules = {f"bertkit.tasks.{name}" for name in ("classification", "tagging", "squad", "multiple_choice")}
    assert not imported & task_modules
    source = ast.unparse(tree)
    assert "getattr(task" not in source and "SquadTask" not in source and "task: Any" not in source


def test_a_multi_label_classifier_made_elsewhere_is_refused_not_read_as_single_label():
    """Its independent sigmoid scores were served as a softmax over the labels (the ranks and sums wrong)."""
    from bertkit.tasks.classification import ClassificationTask

    config = preset("bert-debug", vocab_size=10, id2label={0: "sports", 1: "tech"},
                    problem_type="multi_label_classification")
    with pytest.raises(BertkitError, match="problem_type multi_label_classification .* use transformers"):
        ClassificationTask.from_config(config)
    assert ClassificationTask.from_config(config.replace(problem_type="single_label_classification")).settings.labels \
        == ["sports", "tech"]


@pytest.mark.parametrize("head", ["BertForTokenClassification", "BertForQuestionAnswering"])
def test_a_model_made_elsewhere_with_few_positions_gets_windows_that_fit_them(head, tmp_path):
    """Tagging and QA took their 128/384-token defaults whatever the model's positions: an IndexError traceback
    (a 500 from the server) on a model of 64."""
    import transformers

    from bertkit.serve.predictor import load_predictor
    from bertkit.settings import SquadSettings, TaggingSettings

    assert TaggingSettings.fitted_to(64) == {"max_seq_length": 64, "doc_stride": 32}
    assert SquadSettings.fitted_to(64) == {"max_seq_length": 64, "doc_stride": 21, "max_query_length": 10}
    assert SquadSettings.fitted_to(512) == {}
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "where", "?"]
    config = transformers.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64,
                                     **({"id2label": {0: "O", 1: "B-X", 2: "I-X"}} if "Token" in head else {}))
    getattr(transformers, head)(config).save_pretrained(tmp_path)
    WordPieceTokenizer(words).save_pretrained(tmp_path)
    predictor = load_predictor(tmp_path)
    text = " ".join(["the cat sat on the mat"] * 40)  # 240 tokens
    if head == "BertForTokenClassification":
        assert isinstance(predictor.tag([text]), list)
    else:
        assert isinstance(predictor.answer(["where sat the cat ?"], [text]), list)


def test_predict_and_evaluate_read_a_classifier_fine_tuned_with_transformers(tmp_path):
    """They refused it (no bertkit_task.json) where serve read it; its task now comes from config.json."""
    import transformers

    from bertkit.cli import main

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film", "plot"]
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64,
                                     id2label={0: "positive", 1: "negative"})
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path / "hf")
    WordPieceTokenizer(words).save_pretrained(tmp_path / "hf")
    texts = ["good film", "bad plot", "good plot", "bad film"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t, "label": "positive"}) + "\n" for t in texts))
    assert main(["predict", "--model", str(tmp_path / "hf"), "--input", str(tmp_path / "in.jsonl"), "--output",
                 str(tmp_path / "p"), "--precision", "fp32", "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p" / "predictions.jsonl").read_text().splitlines()]
    tokenizer = transformers.BertTokenizer.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = model(**tokenizer(texts, return_tensors="pt", padding=True)).logits.argmax(-1).tolist()
    assert [row["label"] for row in rows] == [config.id2label[i] for i in expected]
    assert main(["evaluate", "--model", str(tmp_path / "hf"), "--input", str(tmp_path / "in.jsonl"), "--output",
                 str(tmp_path / "e"), "--precision", "fp32", "--device", "cpu"]) == 0
    accuracy = json.loads((tmp_path / "e" / "eval_results.json").read_text())["accuracy"]
    assert accuracy == pytest.approx(expected.count(0) / 4)
