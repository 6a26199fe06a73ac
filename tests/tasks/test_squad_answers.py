"""SQuAD answers end to end: whole words from every path (fine-tuning evaluation, `predict`/`evaluate`,
the server's predictor) and the same predictions from fine-tuning's evaluation and `bertkit evaluate`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertkit.cli import main
from bertkit.config import preset
from bertkit.data.squad import SquadExample
from bertkit.model import BertForQuestionAnswering
from bertkit.serve.predictor import load_predictor
from bertkit.settings import PredictSettings
from bertkit.tasks.squad import SquadSettings, SquadTask
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train.distributed import DistributedContext
from bertkit.workflows.predict import predict_file
from bertkit.workflows.seeds import DevSet, SeedRun

# --- whole words ---------------------------------------------------------------------------------

PIECES = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "k", "##itten", "played", "with", "ball", ".",
          "rad", "##ical", "##s", "comp", "##lem", "##ent", "it", "what", "is", "?"]
CONTEXT = "The kitten played with the ball. Radicals complement it."
QUESTION = "what is it?"
SETTINGS = {"max_seq_length": 16, "doc_stride": 3, "max_query_length": 8}  # 3 windows of 10 context tokens


def _pieces() -> WordPieceTokenizer:
    return WordPieceTokenizer(PIECES, do_lower_case=True)


def _pointing_model(tokenizer: WordPieceTokenizer, start_piece: str, end_piece: str) -> BertForQuestionAnswering:
    """A real BERT whose start logit is highest at `start_piece` and end logit at `end_piece`: every
    layer adds zero, so a position's last hidden state is the normalised embedding of its own token, and
    by Cauchy-Schwarz that vector's dot product is largest with itself."""
    torch.manual_seed(0)
    model = BertForQuestionAnswering(preset("bert-debug", vocab_size=tokenizer.vocab_size)).eval()
    with torch.no_grad():
        model.bert.embeddings.position.weight.zero_()
        model.bert.embeddings.token_type.weight.zero_()
        for layer in model.bert.layers:
            for linear in (layer.attn_out, layer.ffn_out):
                linear.weight.zero_()
                linear.bias.zero_()
        words = model.bert.embeddings.word.weight
        ids = tokenizer.convert_tokens_to_ids([start_piece, end_piece])
        model.qa_outputs.weight.copy_(F.layer_norm(words[ids], (words.shape[1],)))
        model.qa_outputs.bias.zero_()
    return model


CASES = [("##itten", "ball", "kitten played with the ball"),  # starts inside "kitten"
         ("##ical", "##ical", "Radicals"),                  # one piece in the middle of a word
         ("##lem", "##lem", "complement"),
         ("rad", "comp", "Radicals complement")]             # ends on the first piece of a word


@pytest.mark.parametrize(("start_piece", "end_piece", "expected"), CASES)
def test_every_path_answers_whole_words(tmp_path: Path, start_piece: str, end_piece: str, expected: str) -> None:
    """Fine-tuning's dev evaluation, `bertkit predict`/`evaluate` and the server's predictor all widen a
    span that starts or ends on a word piece to the whole words."""
    tokenizer = _pieces()
    model = _pointing_model(tokenizer, start_piece, end_piece)
    task = SquadTask(SquadSettings(**SETTINGS))
    example = SquadExample("q", QUESTION, CONTEXT, ((expected, CONTEXT.index(expected)),), False)
    dev = DevSet("", [example], task.features([example], tokenizer))
    assert len(dev.features) > 1  # the answer is decoded across windows
    run = SeedRun(task, tokenizer, [dev], 64, tmp_path,
                   DistributedContext(device=torch.device("cpu")))
    assert run.evaluate(model)["exact_match"] == 100.0
    assert run.latest[0][1]["predictions"] == {"q": expected}

    directory = tmp_path / "model"
    model.save_pretrained(directory, tokenizer=tokenizer)
    (directory / "bertkit_task.json").write_text(json.dumps(task.to_json()), encoding="utf-8")
    squad = tmp_path / "dev.json"
    answers = [{"text": expected, "answer_start": CONTEXT.index(expected)}]
    squad.write_text(json.dumps({"data": [{"paragraphs": [{"context": CONTEXT, "qas": [
        {"id": "q", "question": QUESTION, "answers": answers}]}]}]}))
    metrics = predict_file(PredictSettings(directory, squad, tmp_path / "eval", evaluate=True, device="cpu"))
    assert metrics["exact_match"] == 100.0
    assert json.loads((tmp_path / "eval" / "predictions.json").read_text()) == {"q": expected}

    [result] = load_predictor(directory).answer([QUESTION], [CONTEXT])
    assert result["answer"] == expected == CONTEXT[result["start"]:result["end"]]


def test_a_word_cut_by_the_window_edge_is_answered_whole() -> None:
    """The span ends on the last token of a window, inside a word that goes on in the next window: the
    word's end comes from the whole context, not from the window."""
    tokenizer = _pieces()
    context = "the the the complement the the the"
    example = SquadExample("q", "what ?", context, (), False)
    task = SquadTask(SquadSettings(max_seq_length=10, doc_stride=3, max_query_length=4))  # windows of 5 tokens
    features = task.features([example], tokenizer)
    [feature] = [f for f in features if tokenizer.convert_ids_to_tokens(f["input_ids"][-2]) == "##lem"]
    tokens = tokenizer.convert_ids_to_tokens(feature["input_ids"])
    start, end = tokens.index("comp"), tokens.index("##lem")
    assert feature["max_context"][start] and "##ent" not in tokens
    logits = [np.full(len(f["input_ids"]), -10.0) for f in features]
    starts, ends = [x.copy() for x in logits], [x.copy() for x in logits]
    index = features.index(feature)
    starts[index][start] = ends[index][end] = 5.0
    decoded = task.decode([example], features, {"start_logits": starts, "end_logits": ends})
    assert decoded["predictions"]["q"] == "complement"
    best = decoded["nbest"]["q"][0]
    assert (best["start_char"], best["end_char"]) == (12, 22)


# --- one code path for fine-tuning's evaluation and `bertkit evaluate` ----------------------------

WORDS = "the a kitten played with ball who what where is was of in and paris france capital city".split()


def _squad_file(path: Path, questions: int, seed: int = 0) -> Path:
    """A v2.0 file: varied contexts, answerable and unanswerable questions."""
    rng = random.Random(seed)
    paragraphs = []
    for p in range(questions // 3):
        context = " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 40))) + " ."
        qas = []
        for q in range(3):
            word = rng.choice(context.split()[:-1])
            start = context.index(f" {word} ") + 1 if f" {word} " in context else 0
            answer = {"text": context[start:start + len(word)], "answer_start": start}
            impossible = q == 2
            qas.append({"id": f"p{p}-q{q}", "question": f"what {rng.choice(WORDS)} {rng.choice(WORDS)} ?",
                        "answers": [] if impossible else [answer], "is_impossible": impossible})
        paragraphs.append({"context": context, "qas": qas})
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("vocab")
    WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "?", "."]).save_pretrained(directory)
    return directory


def test_finetuning_evaluation_and_bertkit_evaluate_agree_exactly(vocab: Path, tmp_path: Path) -> None:
    """Evaluation inside the bf16 training loop and `bertkit evaluate` on the saved model give the same
    predictions, n-best lists, null odds and metrics, bit for bit (v2.0: the threshold chosen on dev too)."""
    dev = _squad_file(tmp_path / "dev.json", questions=24)
    out = tmp_path / "out"
    assert main(["finetune", "squad", "--model", "bert-debug", "--tokenizer", str(vocab), "--train", str(dev),
                 "--dev", str(dev), "--output", str(out), "--epochs", "2", "--batch-size", "8",
                 "--learning-rate", "1e-3", "--precision", "bf16", "--device", "cpu", "--max-seq-length", "32",
                 "--doc-stride", "8", "--max-query-length", "8", "--version-2-with-negative"]) == 0
    trained = json.loads((out / "eval_results.json").read_text())
    metrics = predict_file(PredictSettings(out / "best", dev, tmp_path / "eval", evaluate=True, device="cpu"))
    for name in ("predictions.json", "nbest_predictions.json", "null_odds.json"):
        assert json.loads((tmp_path / "eval" / name).read_text()) == json.loads((out / name).read_text()), name
    shared = set(metrics) & set(trained)
    assert {"f1", "exact_match", "best_f1", "best_f1_thresh", "null_score_diff_threshold"} <= shared
    assert {k: metrics[k] for k in shared} == {k: trained[k] for k in shared}
