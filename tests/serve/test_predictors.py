"""Predictors: each task's results against an independent computation, fixed-logit models for exact
entity and answer spans across windows, batched == one-by-one, and the choice of predictor."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.model import BertForMaskedLM, BertModel
from bertkit.model.feature_based import FeatureBasedModel
from bertkit.serve.predictor import (
    ClassificationPredictor,
    FillMaskPredictor,
    Predictor,
    QuestionAnsweringPredictor,
    TaggingPredictor,
    load_predictor,
)
from bertkit.settings import PredictSettings, ServeSettings
from bertkit.tasks.classification import ClassificationSettings, ClassificationTask
from bertkit.tasks.finetuned import FEATURE_HEAD_FILE
from bertkit.tasks.squad import SquadSettings, SquadTask
from bertkit.tasks.tagging import TaggingSettings, TaggingTask
from bertkit.workflows.predict import predict_file

from .conftest import TAGS, VOCAB, build, build_feature_based, tokenizer

TEXTS = ["the cat sat on the mat.", "john", "where did the big red dog go in the park?", "",
         "paris is the capital of france and london is big"]


def _tensors(encoding) -> dict[str, torch.Tensor]:
    return {k: torch.tensor([getattr(encoding, k)]) for k in ("input_ids", "token_type_ids", "attention_mask")}


# --- fill-mask ---------------------------------------------------------------------------------

def test_fill_mask_top_k_are_the_softmax_of_the_full_logits(mlm_dir):
    predictor = load_predictor(mlm_dir)
    assert isinstance(predictor, FillMaskPredictor) and predictor.endpoints == ("fill-mask", "embed")
    [result] = predictor.fill_mask(["the [MASK] sat on the [MASK] ."], top_k=3)
    model = BertForMaskedLM.from_pretrained(mlm_dir).eval()
    ids = torch.tensor([[2, VOCAB.index("the"), 4, VOCAB.index("sat"), VOCAB.index("on"), VOCAB.index("the"), 4,
                         VOCAB.index("."), 3]])
    probabilities = model(ids).logits[0].softmax(-1)  # (T, V), dense projection everywhere
    assert len(result) == 2  # one list per [MASK], left to right
    for position, candidates in zip((2, 6), result):
        expected_scores, expected_ids = probabilities[position].topk(3)
        assert [c["token_id"] for c in candidates] == expected_ids.tolist()
        assert [c["token"] for c in candidates] == [VOCAB[i] for i in expected_ids.tolist()]
        np.testing.assert_allclose([c["score"] for c in candidates], expected_scores.tolist(), rtol=1e-5)


def test_fill_mask_errors_name_the_input(mlm_dir):
    predictor = load_predictor(mlm_dir)
    with pytest.raises(BertkitError, match=r"inputs\[1\] has no \[MASK\]"):
        predictor.fill_mask(["a [MASK]", "no mask here"])
    with pytest.raises(BertkitError, match="top_k"):
        predictor.fill_mask(["a [MASK]"], top_k=0)
    with pytest.raises(BertkitError, match="max_seq_length"):
        predictor.fill_mask(["the cat " * 80 + "[MASK]"])


# --- classification ------------------------------------------------------------------------------

def test_classify_matches_the_model_and_reads_pairs(classifier_dir):
    predictor = load_predictor(classifier_dir)
    assert isinstance(predictor, ClassificationPredictor)
    results = predictor.classify(["the cat sat", "the dog ran"], ["on the mat", "in the park"])
    for (text, pair), result in zip([("the cat sat", "on the mat"), ("the dog ran", "in the park")], results):
        logits = predictor.model(**_tensors(tokenizer().encode(text, pair))).logits[0]
        expected = dict(zip(["negative", "positive", "neutral"], logits.softmax(-1).tolist()))
        assert result["label"] == max(expected, key=expected.get)
        assert result["probabilities"] == pytest.approx(expected, rel=1e-5)
        assert result["truncated"] is False
    assert predictor.classify(["the cat " * 20])[0]["truncated"] is True  # max_seq_length 16


def test_regression_returns_a_score(regression_dir):
    predictor = load_predictor(regression_dir)
    [result] = predictor.classify(["the cat sat"])
    expected = predictor.model(**_tensors(tokenizer().encode("the cat sat"))).logits[0, 0].item()
    assert set(result) == {"score", "truncated"} and result["score"] == pytest.approx(expected, rel=1e-5)


# --- tagging and QA with fixed-logit models (exact expected spans) ------------------------------

@dataclass
class _Out:
    logits: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None


class TableModel(torch.nn.Module):
    """Logits that depend on the token id alone, so the right entities/answers are known exactly."""

    def __init__(self, table: torch.Tensor, qa: bool = False) -> None:
        super().__init__()
        self.table, self.qa = table, qa  # (V, outputs)
        self.config = preset("bert-debug", vocab_size=len(VOCAB))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        logits = self.table[input_ids]  # (B, T, outputs)
        if self.qa:
            start, end = (logits * (token_type_ids == 1)[..., None]).unbind(-1)
            start[:, 0] = end[:, 0] = 0.5  # the null score at [CLS]
            return _Out(start_logits=start, end_logits=end)
        return _Out(logits=logits)


def _tagger(max_seq_length: int = 10) -> TaggingPredictor:
    table = torch.zeros(len(VOCAB), len(TAGS))
    table[:, 0] = 1.0  # 'O' by default
    for word, tag in [("john", "B-PER"), ("smith", "I-PER"), ("london", "B-LOC"), ("paris", "B-LOC"),
                      ("un", "B-LOC"), ("##der", "B-PER")]:
        table[VOCAB.index(word), TAGS.index(tag)] = 5.0
    task = TaggingTask(TaggingSettings(labels=TAGS, max_seq_length=max_seq_length, doc_stride=3))
    return TaggingPredictor(TableModel(table), tokenizer(), task, batch_size=3)


def test_tag_merges_sub_tokens_and_gives_character_spans_across_windows():
    text = "The cat sat on the mat in the park and John  Smith lives in London, the big red house of Paris! Under."
    predictor = _tagger()
    [entities] = predictor.tag([text])
    # "Under" is un ##der: the word takes the tag of its first sub-token (B-LOC), never B-PER.
    expected = [("PER", "John  Smith"), ("LOC", "London"), ("LOC", "Paris"), ("LOC", "Under")]
    assert [(e["entity"], e["text"]) for e in entities] == expected
    for entity in entities:
        assert text[entity["start"]:entity["end"]] == entity["text"]
        assert 0.9 < entity["score"] <= 1.0
    sentences, _ = predictor.sentences([text])
    assert len(predictor.task.features(sentences, predictor.tokenizer)) > 5  # many windows
    assert _tagger(max_seq_length=64).tag([text]) == [entities]  # one window gives the same entities


def _reader(version_2: bool, threshold: float = 0.0) -> QuestionAnsweringPredictor:
    table = torch.zeros(len(VOCAB), 2)
    table[VOCAB.index("london"), 0] = 3.0  # start
    table[VOCAB.index("house"), 1] = 3.0  # end
    settings = SquadSettings(max_seq_length=20, doc_stride=4, max_query_length=6, n_best_size=20,
                             max_answer_length=6, version_2_with_negative=version_2,
                             null_score_diff_threshold=threshold)
    return QuestionAnsweringPredictor(TableModel(table, qa=True), tokenizer(), SquadTask(settings), batch_size=2)


CONTEXT = ("The cat sat on the mat in the park. The dog ran. John Smith lives in London, a big red house, "
           "and the cat is in Paris.")


def test_answer_finds_the_span_in_a_long_context():
    [result] = _reader(version_2=False).answer(["where did john go?"], [CONTEXT])
    assert result["answer"] == "London, a big red house"
    assert CONTEXT[result["start"]:result["end"]] == result["answer"]
    assert result["no_answer"] is False and 0 < result["score"] <= 1


def test_answer_v2_uses_the_null_threshold_from_the_task_file():
    # null score 0.5 + 0.5 = 1.0, best span 3.0 + 3.0 = 6.0: diff -5.0.
    answer = _reader(version_2=True, threshold=0.0).answer(["where?"], [CONTEXT])[0]["answer"]
    assert answer == "London, a big red house"
    result = _reader(version_2=True, threshold=-6.0).answer(["where?"], [CONTEXT])[0]
    assert result["answer"] == "" and result["no_answer"] and result["start"] is None
    assert result["null_score_diff"] == pytest.approx(-5.0)


# --- embeddings ------------------------------------------------------------------------------------

def test_embed_poolings(mlm_dir):
    predictor = load_predictor(mlm_dir)
    encoder = BertModel.from_pretrained(mlm_dir).eval()
    with torch.no_grad():
        hidden = encoder(**_tensors(tokenizer().encode("the cat sat"))).last_hidden_state[0]  # (T, H)
    np.testing.assert_allclose(predictor.embed(["the cat sat"], "cls")[0], hidden[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(predictor.embed(["the cat sat"], "mean")[0], hidden.mean(0).numpy(), atol=1e-5)
    assert np.linalg.norm(predictor.embed(["the cat sat"], "mean", normalize=True)[0]) == pytest.approx(1.0)
    np.testing.assert_allclose(predictor.embed(["the cat sat"], "max")[0], hidden.amax(0).numpy(), atol=1e-5)
    np.testing.assert_allclose(predictor.embed(["the cat sat"], "mean_sqrt_len_tokens")[0],
                               hidden.sum(0).numpy() / np.sqrt(len(hidden)), atol=1e-5)
    np.testing.assert_array_equal(predictor.embed(["the cat sat"]), predictor.embed(["the cat sat"], "cls"))  # auto
    assert predictor.embed([]).shape == (0, 32)
    with pytest.raises(BertkitError, match="pooling 'weightedmean' is not supported"):
        predictor.embed(["x"], "weightedmean")


# --- batching ----------------------------------------------------------------------------------------

def _one_by_one_equals_batched(call, inputs, predictor):
    predictor.batch_size = 1
    single = [call([x])[0] for x in inputs]
    predictor.batch_size = 4
    return single, call(inputs)


def _close(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _close(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=1e-5)
    else:
        assert a == b


@pytest.mark.parametrize("fixture", ["mlm_dir", "classifier_dir", "tagger_dir", "squad_dir", "squad_v2_dir"])
def test_batched_results_equal_one_by_one(fixture, request):
    predictor = load_predictor(request.getfixturevalue(fixture))
    calls = {
        FillMaskPredictor: lambda xs: predictor.fill_mask([x + " [MASK]" for x in xs], top_k=3),
        ClassificationPredictor: lambda xs: predictor.classify(xs),
        TaggingPredictor: lambda xs: predictor.tag(xs),
        QuestionAnsweringPredictor: lambda xs: predictor.answer(["who lives in london?"] * len(xs), xs),
    }
    single, batched = _one_by_one_equals_batched(calls[type(predictor)], TEXTS, predictor)
    _close(single, batched)
    single, batched = _one_by_one_equals_batched(lambda xs: list(predictor.embed(xs, "mean")), TEXTS, predictor)
    np.testing.assert_allclose(np.stack(single), np.stack(batched), atol=1e-5)


# --- loading -----------------------------------------------------------------------------------------

def test_load_predictor_without_task_file_reads_the_architecture(tmp_path, tagger_dir, squad_dir):
    for source, cls in [(tagger_dir, TaggingPredictor), (squad_dir, QuestionAnsweringPredictor)]:
        copy = shutil.copytree(source, tmp_path / source.name)
        (copy / "bertkit_task.json").unlink()
        assert type(load_predictor(copy)) is cls
    bare = build(tmp_path / "bare", BertModel)
    assert type(load_predictor(bare)) is Predictor and Predictor.endpoints == ("embed",)


def test_load_predictor_errors(tmp_path, classifier_dir):
    copy = shutil.copytree(classifier_dir, tmp_path / "c")
    (copy / "bertkit_task.json").write_text("{not json")
    with pytest.raises(BertkitError, match="bertkit_task.json: not valid JSON"):
        load_predictor(copy)
    (copy / "bertkit_task.json").write_text(json.dumps({"labels": ["a"]}))
    with pytest.raises(BertkitError, match="'task' key"):
        load_predictor(copy)
    mlm = build(tmp_path / "mlm", BertForMaskedLM)
    (mlm / "bertkit_task.json").write_text(json.dumps({"task": "classification", "labels": ["a", "b"]}))
    with pytest.raises(BertkitError, match="not a fine-tuned BertForSequenceClassification"):
        load_predictor(mlm)


def test_feature_based_models_are_served_as_predict_reads_them(tmp_path):
    """A feature-based directory (frozen encoder + feature_head.safetensors) is served with the predictions
    `bertkit predict` makes from it and the model computes (issue 15: the predictor used to refuse it)."""
    task = ClassificationTask(ClassificationSettings(labels=["negative", "positive", "neutral"], max_seq_length=16))
    directory, model = build_feature_based(tmp_path / "fb", task)
    predictor = load_predictor(directory)
    assert isinstance(predictor, ClassificationPredictor) and isinstance(predictor.model, FeatureBasedModel)
    texts = [t for t in TEXTS if t]
    served = predictor.classify(texts)
    for text, result in zip(texts, served):
        with torch.no_grad():
            logits = model(**_tensors(tokenizer().encode(text, max_length=16))).logits[0]
        expected = dict(zip(task.settings.labels, logits.softmax(-1).tolist()))
        assert result["label"] == max(expected, key=expected.get)
        np.testing.assert_allclose([result["probabilities"][k] for k in expected], list(expected.values()), atol=1e-5)
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    predict_file(PredictSettings(directory, inputs, tmp_path / "predicted", device="cpu"))
    lines = (tmp_path / "predicted" / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["label"] for line in lines] == [r["label"] for r in served]


def test_feature_based_question_answering_is_served(tmp_path):
    """The span head of a feature-based QA model reaches the predictor as start/end logits."""
    directory, _ = build_feature_based(tmp_path / "qa", SquadTask(SquadSettings(max_seq_length=16, doc_stride=4)),
                                      layers=(-1,), combine="sum")
    predictor = load_predictor(directory)
    assert isinstance(predictor, QuestionAnsweringPredictor)
    [result] = predictor.answer(["who lives in london?"], ["john smith lives in london and paris"])
    assert result["start"] is not None and result["answer"]


def test_feature_based_directory_without_its_head_is_refused_clearly(tmp_path):
    directory, _ = build_feature_based(tmp_path / "fb", TaggingTask(TaggingSettings(labels=TAGS, max_seq_length=10)))
    (directory / FEATURE_HEAD_FILE).unlink()
    with pytest.raises(BertkitError, match="feature-based model .* feature_head.safetensors"):
        load_predictor(directory)


@pytest.mark.parametrize("fixture", ["mlm_dir", "classifier_dir", "tagger_dir", "squad_dir"])
def test_bf16_predictors_agree_with_fp32(fixture, request):
    """--precision bf16: the weights are cast, every endpoint runs, and scores stay within bf16 rounding."""
    directory = request.getfixturevalue(fixture)
    exact, fast = load_predictor(directory), load_predictor(ServeSettings(directory, precision="bf16"))
    assert next(fast.model.parameters()).dtype == torch.bfloat16
    np.testing.assert_allclose(fast.embed(TEXTS, "mean"), exact.embed(TEXTS, "mean"), atol=0.05, rtol=0.05)
    if isinstance(exact, ClassificationPredictor):
        for a, b in zip(exact.classify(TEXTS), fast.classify(TEXTS)):
            assert list(b["probabilities"].values()) == pytest.approx(list(a["probabilities"].values()), abs=0.02)
    if isinstance(exact, FillMaskPredictor):
        top = fast.fill_mask(["the cat [MASK] on the mat."], top_k=3)[0][0]
        assert len(top) == 3 and all(0.0 <= c["score"] <= 1.0 for c in top)
    if isinstance(exact, TaggingPredictor):
        assert len(fast.tag(TEXTS)) == len(TEXTS)
    if isinstance(exact, QuestionAnsweringPredictor):
        assert len(fast.answer(["who lives in london?"], ["john lives in london"])) == 1


def test_unknown_precision_is_a_clear_error(classifier_dir):
    with pytest.raises(BertkitError, match="--precision 'fp16': use one of auto, fp32, bf16, int8"):
        load_predictor(ServeSettings(classifier_dir, precision="fp16"))
