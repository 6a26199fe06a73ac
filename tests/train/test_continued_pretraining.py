"""Continued pre-training of an existing checkpoint (`bertkit pretrain --init-from DIR`): a sentence-transformers
directory (a bare BertModel, no pre-training heads) gets the heads initialised as the paper's, trains MLM-only
or MLM + NSP, comes out as a sentence-transformers directory again, `--recipe auto` picks the continued
pre-training recipe and prints it, and a killed run from a vocabulary-extended checkpoint resumes bit-exactly.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertkit.cli import main
from bertkit.config import preset
from bertkit.data import InstanceSettings, build_pretraining_data
from bertkit.model import BertForPreTraining, BertModel
from bertkit.settings import PretrainingDataSettings
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows import pretrain_plan
from bertkit.workflows.recipes import CONTINUE_PASSES, choose_recipe, continue_steps


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, write_toy_corpus) -> dict[str, Path]:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    root = tmp_path_factory.mktemp("continued")
    corpus = write_toy_corpus(root / "corpus.txt", documents=30, sentences=(2, 8), words=(4, 14))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=120, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    BertModel(preset("bert-debug", vocab_size=tokenizer.vocab_size)).save_pretrained(root / "bert", tokenizer=tokenizer)
    transformer = Transformer(str(root / "bert"))
    pooling = Pooling(transformer.get_embedding_dimension(), "mean")
    SentenceTransformer(modules=[transformer, pooling, Normalize()], device="cpu").save(str(root / "st"))
    for nsp in (True, False):
        build_pretraining_data(PretrainingDataSettings(
            (str(corpus),), "(in memory)", str(root / f"data-{'nsp' if nsp else 'mlm'}"), workers=1, quiet=True,
            instances=InstanceSettings(max_seq_length=32, max_predictions_per_seq=5, nsp=nsp,
                                                      masking="dynamic")), tokenizer)
    domain = root / "domain.txt"
    domain.write_text("".join("the millstones by the riverbank and the grainbook of the bookkeeper.\n"
                              "stonemills and millstones.\n\n" for _ in range(30)))
    assert main(["tokenizer", "extend", "--model", str(root / "st"), "--corpus", str(domain), "--add", "4",
                 "--output", str(root / "st-extended")]) == 0
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus), str(domain)), "(in memory)", str(root / "data-extended"), workers=1, quiet=True,
        instances=InstanceSettings(max_seq_length=32, max_predictions_per_seq=5, nsp=False, masking="dynamic")),
        WordPieceTokenizer.from_pretrained(root / "st-extended"))
    return {"root": root, "st": root / "st", "extended": root / "st-extended"}


def pretrain(data: Path, init: Path, output: Path, *extra: str) -> int:
    return main(["pretrain", "--data", str(data), "--init-from", str(init), "--output", str(output),
                 "--eval-examples", "8", "--eval-every", "100", "--device", "cpu", *extra])


def test_a_checkpoint_without_heads_gets_them_initialised_as_the_paper(prepared):
    model = BertForPreTraining.from_pretrained(prepared["st"])
    assert {k.split(".")[0] for k in model.newly_initialized} == {"mlm", "nsp"}
    assert torch.all(model.mlm.bias == 0) and torch.all(model.mlm.norm.weight == 1)
    for weight in (model.mlm.transform.weight, model.nsp.weight):
        assert 0.015 < weight.std().item() < 0.025 and weight.abs().max().item() <= 0.04 + 1e-6  # truncated at 2 std
    assert torch.all(model.nsp.bias == 0)


def test_auto_continues_a_sentence_transformers_directory_mlm_only_and_keeps_it_one(prepared, tmp_path, caplog):
    from sentence_transformers import SentenceTransformer

    caplog.set_level(logging.INFO)
    assert pretrain(prepared["root"] / "data-mlm", prepared["st"], tmp_path, "--max-steps", "3") == 0
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("recipe "))
    assert line.startswith("recipe continue (--init-from a checkpoint pre-trained elsewhere, ~3 steps")
    assert "no NSP head in the checkpoint, so MLM only" in line and "peak lr 0.00049" in line  # 1e-4 x sqrt(768 / 32)
    assert "no MLM head in the checkpoint, so a new one is warmed up first" in line
    assert "the new MLM head trained alone for the first 1 step" in line  # 10% of 3 steps, at least 1
    warning = next(r for r in caplog.records if "sentence-transformers encoder released without" in r.getMessage())
    assert warning.levelno == logging.WARNING and re.search(r"takes \d+\.\d passes over the data", warning.getMessage())
    assert "passes raised it (+4.6)" in warning.getMessage() and "leave out --max-steps" in warning.getMessage()
    final = tmp_path / "final"
    assert json.loads((final / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    for name in ("modules.json", "1_Pooling/config.json", "2_Normalize", "sentence_bert_config.json"):
        assert (final / name).exists(), name
    before = SentenceTransformer(str(prepared["st"]), device="cpu")
    after = SentenceTransformer(str(final), device="cpu")
    texts = ["the miller kept his grain", "old stone mills"]
    a, b = before.encode(texts, convert_to_tensor=True), after.encode(texts, convert_to_tensor=True)
    assert b.shape == a.shape and torch.allclose(b.norm(dim=-1), torch.ones(2))
    assert not torch.allclose(a, b)  # trained
    # MLM-only training never touches the pooler: final/ keeps the released one for fine-tuning from it
    released = load_file(str(prepared["st"] / "model.safetensors"))
    continued = load_file(str(final / "model.safetensors"))
    assert torch.equal(continued["bert.pooler.dense.weight"], released["pooler.dense.weight"])


def test_mlm_and_nsp_from_a_checkpoint_without_an_nsp_head(prepared, tmp_path):
    assert pretrain(prepared["root"] / "data-nsp", prepared["st"], tmp_path, "--max-steps", "2", "--nsp") == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all("nsp_loss" in r for r in records if r["kind"] == "train")
    assert json.loads((tmp_path / "final" / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    assert (tmp_path / "final" / "modules.json").is_file()


def test_continued_pretraining_of_an_extended_model_resumes_bit_exactly(prepared, tmp_path):
    data, init = prepared["root"] / "data-extended", prepared["extended"]
    straight = tmp_path / "straight"
    flags = ("--max-steps", "6", "--save-every", "3", "--batch-size", "4")
    assert pretrain(data, init, straight, *flags) == 0
    killed = tmp_path / "killed"
    shutil.copytree(straight, killed)
    shutil.rmtree(killed / "checkpoints" / "step-00000006")  # as if the process died during step 4
    shutil.rmtree(killed / "final")
    assert pretrain(data, init, killed, *flags, "--resume", "auto") == 0
    losses = {run: [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                    if r["kind"] == "train"] for run in (straight, killed)}
    assert losses[killed] == losses[straight] and len(losses[straight]) == 6
    a, b = (load_file(str(run / "final" / "model.safetensors")) for run in (straight, killed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    vocab_size = WordPieceTokenizer.from_pretrained(init).vocab_size
    assert a["bert.embeddings.word_embeddings.weight"].shape[0] == vocab_size


@pytest.mark.parametrize("name,init,nsp_head,expected", [
    ("auto", "released", False, ("continue", False, 1e-4 * 2 ** 0.5, 0.06)),  # MiniLM-L6-H384, a sentence encoder
    ("auto", "released", True, ("continue", True, 1e-4, 0.06)),  # bert-base with its heads
    ("auto", "short", True, ("short", False, 5e-4 * (256 / 768) ** 0.5, 0.5)),  # a bertkit run being extended
    ("auto", None, True, ("short", False, 5e-4 * (256 / 768) ** 0.5, 0.5)),  # the short recipe: masked LM only
    ("continue", None, True, ("continue", True, 1e-4, 0.06)),
])
def test_recipe_for_continued_pretraining(name, init, nsp_head, expected):
    width = 384 if not nsp_head and init == "released" else 768
    recipe = choose_recipe(name, width, 2_000, init, nsp_head)
    assert (recipe.name, recipe.nsp) == expected[:2]
    assert recipe.learning_rate == pytest.approx(expected[2]) and recipe.warmup_ratio == expected[3]
    assert recipe.dropout is None if recipe.name == "continue" else recipe.dropout == 0.0


def test_a_released_checkpoint_continued_stays_released_to_the_rules_that_read_it(prepared, tmp_path, caplog):
    """Issue 37: 3 steps added to a checkpoint made elsewhere do not make it a barely trained model: the
    fine-tuning rule keeps the released rate, and a second continuation still picks the continue recipe."""
    from bertkit.settings import FinetuneSettings
    from bertkit.workflows.finetune import resolve_learning_rate

    assert pretrain(prepared["root"] / "data-mlm", prepared["st"], tmp_path / "once", "--max-steps", "3") == 0
    record = json.loads((tmp_path / "once" / "final" / "bertkit_pretraining.json").read_text())
    assert record["recipe"] == "continue" and record["steps"] == 3  # the recipe applied, not "auto"
    assert record["continued_from"] == {"directory": str(prepared["st"]), "released": True, "steps": None}
    assert record["total_steps"] is None
    released = resolve_learning_rate(FinetuneSettings(model=str(prepared["st"]), output=tmp_path), False)
    continued = resolve_learning_rate(FinetuneSettings(model=str(tmp_path / "once" / "final"), output=tmp_path), False)
    assert continued == released  # before: 3.4x it, "pre-trained only 3 steps"
    assert pretrain_plan.InitFacts.read(str(tmp_path / "once" / "final")).kind == "released"
    caplog.set_level(logging.INFO)
    assert pretrain(prepared["root"] / "data-mlm", tmp_path / "once" / "final", tmp_path / "twice", "--max-steps",
                    "2") == 0
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("recipe "))
    assert line.startswith("recipe continue (--init-from a checkpoint pre-trained elsewhere")


@pytest.mark.parametrize("budget, mlm_head, expected", [
    (250, False, 25), (3, False, 1), (20_000, False, 500), (None, False, 500), (250, True, 0)])
def test_the_continue_recipe_warms_up_a_new_mlm_head_only(budget, mlm_head, expected):
    recipe = choose_recipe("continue", 384, budget, "released", False, mlm_head)
    assert recipe.head_warmup_steps == expected
    assert ("trained alone" in recipe.describe()) == bool(expected)
    assert choose_recipe("auto", 256, budget, None, True, True).head_warmup_steps == 0  # random init: no warm-up


def test_a_headless_checkpoint_keeps_its_encoder_while_the_new_head_warms_up(prepared, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    assert pretrain(prepared["root"] / "data-mlm", prepared["st"], tmp_path, "--max-steps", "20", "--save-every",
                    "2", "--keep-last", "20", "--batch-size", "4") == 0
    released = {f"bert.{k}": v for k, v in load_file(str(prepared["st"] / "model.safetensors")).items()}
    at_unfreeze = load_file(str(tmp_path / "checkpoints" / "step-00000002" / "model.safetensors"))
    final = load_file(str(tmp_path / "final" / "model.safetensors"))
    encoder = [k for k in at_unfreeze if k.startswith("bert.") and not k.startswith("bert.pooler.")]
    assert encoder and all(torch.equal(at_unfreeze[k], released[k]) for k in encoder)
    assert not torch.equal(at_unfreeze["cls.predictions.transform.dense.weight"],
                           BertForPreTraining.from_pretrained(prepared["st"]).mlm.transform.weight.detach())
    assert not torch.equal(final["bert.encoder.layer.0.attention.self.query.weight"],
                           released["bert.encoder.layer.0.attention.self.query.weight"])
    assert any("head warm-up done after 2 step(s)" in r.getMessage() for r in caplog.records)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["encoder_lr"] == 0 for r in records if r["kind"] == "train"] == [True] * 2 + [False] * 18


def test_a_given_head_warmup_is_kept(prepared, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    assert pretrain(prepared["root"] / "data-mlm", prepared["st"], tmp_path, "--max-steps", "3",
                    "--head-warmup-steps", "0") == 0
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("recipe "))
    assert "your flags kept: head_warmup_steps" in line
    assert all("encoder_lr" not in json.loads(row) for row in (tmp_path / "metrics.jsonl").read_text().splitlines())


@pytest.mark.parametrize("instances, batch, expected", [
    (15_922, None, (2_986, 32)),  # the KJV corpus at 64 tokens: 6 passes at the recipe's batch (the study: 3,000)
    (15_922, 64, (1_493, 64)),  # a given global batch is kept
    (2_000_000, None, (46_875, 256)),  # 375,000 steps of 32 would reach the paper's range: its batch of 256
    (3, None, (1, 32)),
])
def test_continued_pretraining_without_a_budget_takes_the_recipes_passes(instances, batch, expected):
    assert continue_steps(instances, batch) == expected


def test_a_continued_run_without_a_budget_trains_the_recipes_passes_and_says_so(prepared, tmp_path, caplog, capsys):
    from bertkit.data import PretrainingDataset

    caplog.set_level(logging.INFO)
    everything = len(PretrainingDataset(prepared["root"] / "data-mlm"))
    instances = everything - min(8, everything // 10)  # the --eval-examples 8 held out are not trained on
    assert pretrain(prepared["root"] / "data-mlm", prepared["st"], tmp_path / "run", "--global-batch-size",
                    "64") == 0
    expected = -(-CONTINUE_PASSES * instances // 64)
    assert json.loads((tmp_path / "run" / "final" / "bertkit_pretraining.json").read_text())["steps"] == expected
    assert any(f"takes {CONTINUE_PASSES} passes over the {instances:,} instances" in r.getMessage()
               for r in caplog.records)
    # the recipe's own passes: no warning that a short continuation of this headless encoder loses accuracy
    assert not any("released without its masked-LM head" in r.getMessage() for r in caplog.records)
    # a run from random weights, or auto from a short bertkit run, still needs a budget: nothing is guessed
    capsys.readouterr()
    assert main(["pretrain", "--data", str(prepared["root"] / "data-mlm"), "--model", "bert-debug",
                 "--tokenizer", str(prepared["st"]), "--output", str(tmp_path / "random"), "--device", "cpu"]) != 0
    assert "no training budget" in capsys.readouterr().err
