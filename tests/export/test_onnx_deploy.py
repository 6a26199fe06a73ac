"""`bertkit export onnx --output DIR`: a directory that deploys without bertkit (transformers' AutoTokenizer or
`tokenizers` + onnxruntime give PyTorch's logits), and `--optimize`: ONNX Runtime's fused BERT graph, equal to
PyTorch within 1e-4, with the fusions it claims."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.export.onnx import export_onnx
from bertkit.model import BertForSequenceClassification, BertForTokenClassification
from bertkit.settings import ClassificationSettings, ExportSettings
from bertkit.tasks.classification import ClassificationTask
from bertkit.tokenizer import WordPieceTokenizer

from .conftest import build, build_feature_based, tokenizer

TEXTS = ["the cat sat on the mat .", "john lives in london", "paris", "where did the big red dog go in the park ?"]
PAIRS = ["a big house", "is paris the capital of france ?", "un ##der", "the dog ran"]


def _session(path) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _pytorch_logits(model_class, directory, batch) -> np.ndarray:
    model = model_class.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(**{k: torch.as_tensor(v) for k, v in batch.items()}).logits.numpy()


def test_the_directory_holds_graph_tokenizer_label_map_and_task(tmp_path, classifier_dir):
    report = export_onnx(ExportSettings(classifier_dir, tmp_path / "onnx"))
    files = {p.name for p in (tmp_path / "onnx").iterdir()}
    assert files == {"model.onnx", "config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
                     "tokenizer.json", "bertkit_task.json"}
    assert set(report.files) == files and report.path == tmp_path / "onnx" / "model.onnx"
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["model_type"] == "bert"
    assert config["id2label"] == {"0": "negative", "1": "positive", "2": "neutral"}
    assert config["label2id"] == {"negative": 0, "positive": 1, "neutral": 2}
    assert json.loads((tmp_path / "onnx" / "bertkit_task.json").read_text()) == \
        json.loads((classifier_dir / "bertkit_task.json").read_text())
    assert (tmp_path / "onnx" / "vocab.txt").read_text() == (classifier_dir / "vocab.txt").read_text()
    assert "directory" in "\n".join(report.lines())


def test_autotokenizer_and_onnxruntime_give_pytorchs_logits(tmp_path, classifier_dir):
    export_onnx(ExportSettings(classifier_dir, tmp_path / "onnx"))
    hf = AutoTokenizer.from_pretrained(tmp_path / "onnx")
    ours = tokenizer()
    for text, pair in zip(TEXTS, PAIRS):  # the same ids as bertkit's tokenizer, single texts and pairs
        assert hf(text)["input_ids"] == ours.encode(text).input_ids
        encoded = ours.encode(text, pair)
        assert hf(text, pair)["input_ids"] == encoded.input_ids
        assert hf(text, pair)["token_type_ids"] == encoded.token_type_ids
    plain = Tokenizer.from_file(str(tmp_path / "onnx" / "tokenizer.json"))
    assert [e.ids for e in plain.encode_batch(TEXTS)] == [ours.encode(t).input_ids for t in TEXTS]
    batch = dict(hf(TEXTS, PAIRS, padding=True, return_tensors="np"))  # padded: rows of different lengths
    assert (batch["attention_mask"] == 0).any()
    logits = _session(tmp_path / "onnx" / "model.onnx").run(["logits"], batch)[0]
    np.testing.assert_allclose(logits, _pytorch_logits(BertForSequenceClassification, classifier_dir, batch),
                               atol=1e-4, rtol=0)


def test_optimize_writes_the_fused_graph_equal_to_pytorch(tmp_path, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tagger")
    build(directory, BertForTokenClassification, num_labels=5)
    report = export_onnx(ExportSettings(directory, tmp_path / "onnx", optimize=True))
    layers = 2  # bert-debug
    assert report.fused["Attention"] == layers and report.fused["EmbedLayerNormalization"] == 1
    assert report.fused["SkipLayerNormalization"] == 2 * layers  # after attention and after the feed-forward
    assert report.fused["BiasGelu"] == layers
    assert report.optimized_max_abs_diff is not None and report.optimized_max_abs_diff <= 1e-4
    assert "Attention 2" in "\n".join(report.lines())
    ops = {node.op_type for node in onnx.load(str(tmp_path / "onnx" / "model.onnx")).graph.node}
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"} <= ops
    session = _session(tmp_path / "onnx" / "model.onnx")
    hf = AutoTokenizer.from_pretrained(tmp_path / "onnx")
    for side in ("right", "left"):  # the raw 2D mask: any padding side
        hf.padding_side = side
        batch = dict(hf(TEXTS, padding=True, return_tensors="np"))
        expected = _pytorch_logits(BertForTokenClassification, directory, batch)
        actual = session.run(["logits"], batch)[0]
        real = batch["attention_mask"].astype(bool)
        np.testing.assert_allclose(actual[real], expected[real], atol=1e-4, rtol=0)


def test_optimize_then_quantize_from_the_command_line(tmp_path, classifier_dir, capsys):
    assert main(["export", "onnx", "--model", str(classifier_dir), "--output", str(tmp_path / "int8.onnx"),
                 "--optimize", "--quantize", "int8"]) == 0
    out = capsys.readouterr().out
    assert "ONNX Runtime-optimized, int8" in out and "Attention 2" in out and "top-1 agreement" in out
    assert [p.name for p in tmp_path.iterdir()] == ["int8.onnx"]  # a .onnx path: the graph alone, as before
    ops = {node.op_type for node in onnx.load(str(tmp_path / "int8.onnx")).graph.node}
    assert "QAttention" in ops or "Attention" in ops


def test_a_feature_based_directory_exports_its_head_without_feature_entries(tmp_path):
    task = ClassificationTask(ClassificationSettings(labels=["a", "b", "c"], max_seq_length=16))
    directory, _ = build_feature_based(tmp_path / "fb", task)
    export_onnx(ExportSettings(directory, tmp_path / "onnx"))
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["id2label"]["2"] == "c"
    saved = json.loads((tmp_path / "onnx" / "bertkit_task.json").read_text())
    assert saved["task"] == "classification" and "feature_layers" not in saved


def test_bad_outputs_are_refused_in_one_line(tmp_path, classifier_dir, capsys):
    with pytest.raises(BertkitError, match="holds a checkpoint"):
        export_onnx(ExportSettings(classifier_dir, classifier_dir))
    (tmp_path / "model").write_text("x")
    with pytest.raises(BertkitError, match="is a file"):
        export_onnx(ExportSettings(classifier_dir, tmp_path / "model"))
    assert main(["export", "onnx", "--model", str(classifier_dir), "--output", str(classifier_dir)]) == 2
    err = capsys.readouterr().err
    assert "bertkit: error: --output" in err and "holds a checkpoint" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


LONG = " ".join(["the cat sat on the mat ."] * 12)  # 84 tokens: past the fine-tuned 16
PAST_POSITIONS = " ".join(["the dog ran"] * 60)  # 180 tokens: past bert-debug's 128 positions too


def test_clients_cut_inputs_where_bertkit_does_and_read_special_token_text_as_text(tmp_path, classifier_dir):
    """tokenizer_config.json carries the fine-tuned length and split_special_tokens, tokenizer.json the
    truncation: AutoTokenizer(truncation=True) and `tokenizers` alone give bertkit's ids on long texts, pairs
    and text holding "[MASK]"/"[SEP]", and the graph answers as PyTorch on them (no shape error past 512)."""
    export_onnx(ExportSettings(classifier_dir, tmp_path / "onnx"))
    hf = AutoTokenizer.from_pretrained(tmp_path / "onnx")
    assert hf.model_max_length == 16  # the classifier's max_seq_length (bertkit_task.json)
    plain = Tokenizer.from_file(str(tmp_path / "onnx" / "tokenizer.json"))
    ours = tokenizer()
    cases = [(LONG, None), (PAST_POSITIONS, None), (LONG, "a big house"), ("the dog", LONG),
             ("the [MASK] sat [SEP] on", None), ("[CLS] paris", "[SEP]")]
    for text, pair in cases:
        expected = ours.encode_batch([text], [pair] if pair else None, max_length=16, truncation=True)[0]
        assert hf(text, pair, truncation=True)["input_ids"] == expected.input_ids, (text[:20], pair)
        assert plain.encode(text, pair).ids == expected.input_ids, (text[:20], pair)
    # The one difference a tokenizer file cannot express (docs/inference.md): a pair cut on both sides to an odd
    # room. Google's rule (bertkit) cuts the second text on ties and keeps 7 + 6 of the 13 tokens; `tokenizers`'
    # longest_first keeps 6 + 7.
    google = ours.encode_batch([LONG], [PAST_POSITIONS], max_length=16, truncation=True)[0].input_ids
    assert google.index(ours.vocab["[SEP]"]) == 8
    assert hf(LONG, PAST_POSITIONS, truncation=True)["input_ids"].index(ours.vocab["[SEP]"]) == 7
    texts, pairs = [c[0] for c in cases[:2]], ["paris", "the [MASK]"]
    batch = dict(hf(texts, pairs, truncation=True, padding=True, return_tensors="np"))
    logits = _session(tmp_path / "onnx" / "model.onnx").run(["logits"], batch)[0]
    np.testing.assert_allclose(logits, _pytorch_logits(BertForSequenceClassification, classifier_dir, batch),
                               atol=1e-4, rtol=0)


@pytest.mark.parametrize("head", ["BertForMaskedLM", "BertForPreTraining"])  # `bertkit pretrain`'s final/: both
def test_a_masked_lm_export_keeps_mask_special_and_a_plain_model_its_positions(head, tmp_path, tmp_path_factory):
    import bertkit.model

    directory = build(tmp_path_factory.mktemp("mlm"), getattr(bertkit.model, head))
    export_onnx(ExportSettings(directory, tmp_path / "onnx"))
    config = json.loads((tmp_path / "onnx" / "tokenizer_config.json").read_text())
    assert config["split_special_tokens"] is False and config["model_max_length"] == 128  # no task: the positions
    hf = AutoTokenizer.from_pretrained(tmp_path / "onnx")
    assert hf("the [MASK] sat")["input_ids"][2] == hf.mask_token_id


def test_a_length_the_directory_gives_itself_is_kept(tmp_path, tmp_path_factory):
    """No bertkit_task.json: the length bertkit's loaders read (a transformers-written tokenizer_config.json, as a
    CrossEncoder's; sentence_bert_config.json) is the one written for clients, not the position table."""
    from bertkit.model import BertModel

    own = build(tmp_path_factory.mktemp("own"), BertForSequenceClassification, num_labels=1)
    config = json.loads((own / "tokenizer_config.json").read_text())
    (own / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 24}))
    export_onnx(ExportSettings(own, tmp_path / "own"))
    assert AutoTokenizer.from_pretrained(tmp_path / "own").model_max_length == 24
    plain = Tokenizer.from_file(str(tmp_path / "own" / "tokenizer.json"))
    assert len(plain.encode(LONG).ids) == 24
    encoder = build(tmp_path_factory.mktemp("st"), BertModel)
    (encoder / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "",
                                                       "type": "sentence_transformers.models.Transformer"}]))
    (encoder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 20, "do_lower_case": False}))
    export_onnx(ExportSettings(encoder, tmp_path / "st"))
    assert AutoTokenizer.from_pretrained(tmp_path / "st").model_max_length == 20


def test_a_sentence_transformers_directory_keeps_its_modules(tmp_path, tmp_path_factory):
    """modules.json, the pooling and Normalize folders and their configs go with the graph, so
    SentenceTransformer(DIR, backend="onnx") pools and normalises as bertkit does. (The ONNX backend needs optimum,
    whose transformers pin conflicts with this environment's: checked by hand in its own venv, docs/inference.md.)"""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    from bertkit.interop.sentence_transformers import read_sentence_transformers
    from bertkit.model import BertModel

    bert = build(tmp_path_factory.mktemp("encoder"), BertModel)
    transformer = Transformer(str(bert))
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), "cls"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "st"))
    report = export_onnx(ExportSettings(tmp_path / "st", tmp_path / "onnx"))
    for name in ("modules.json", "sentence_bert_config.json", "1_Pooling", "2_Normalize"):
        assert name in report.files and (tmp_path / "onnx" / name).exists(), name
    assert read_sentence_transformers(tmp_path / "onnx") == read_sentence_transformers(tmp_path / "st")
    assert json.loads((tmp_path / "onnx" / "1_Pooling" / "config.json").read_text()) == \
        json.loads((tmp_path / "st" / "1_Pooling" / "config.json").read_text())


def test_a_tokenizer_json_this_tokenizers_cannot_read_is_kept_with_a_warning(tmp_path, tmp_path_factory, caplog):
    directory = build(tmp_path_factory.mktemp("newer"), BertForSequenceClassification, num_labels=2)
    (directory / "tokenizer.json").write_text('{"version": "9.0", "model": {"type": "FromTheFuture"}}')
    export_onnx(ExportSettings(directory, tmp_path / "onnx"))
    assert (tmp_path / "onnx" / "tokenizer.json").read_text() == (directory / "tokenizer.json").read_text()
    assert "kept as copied, without a truncation of 128 tokens" in caplog.text
    assert json.loads((tmp_path / "onnx" / "tokenizer_config.json").read_text())["model_max_length"] == 128


def test_a_vocabulary_that_reads_special_token_text_as_special_is_exported_as_it_is_read(tmp_path, classifier_dir):
    """A directory whose tokenizer_config.json says split_special_tokens false (a transformers save) is read by
    bertkit with "[SEP]" in a text as the special token; the export says the same, so clients agree with
    `bertkit predict` on that directory instead of splitting the literal."""
    copy = tmp_path / "classifier"
    shutil.copytree(classifier_dir, copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "split_special_tokens": False}))
    export_onnx(ExportSettings(copy, tmp_path / "onnx"))
    assert json.loads((tmp_path / "onnx" / "tokenizer_config.json").read_text())["split_special_tokens"] is False
    ours = WordPieceTokenizer.from_pretrained(copy)
    expected = ours.encode_batch(["the [SEP] cat"], None, max_length=16, truncation=True)[0].input_ids
    assert expected.count(ours.vocab["[SEP]"]) == 2
    assert AutoTokenizer.from_pretrained(tmp_path / "onnx")("the [SEP] cat")["input_ids"] == expected


@pytest.mark.parametrize("edit", ["head weights removed", "architectures edited"])
def test_a_fine_tuned_directory_that_contradicts_itself_is_refused_not_exported(edit, tmp_path, classifier_dir):
    """A missing classifier exported random numbers, and an edited architectures exported another head beside a
    bertkit_task.json naming the first: both with exit 0 (predict refused the first)."""
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "model"
    shutil.copytree(classifier_dir, directory)
    if edit == "head weights removed":
        state = load_file(directory / "model.safetensors")
        save_file({k: v for k, v in state.items() if not k.startswith("classifier.")}, directory / "model.safetensors",
                  metadata={"format": "pt"})
        said = "the weights have none for classifier"
    else:
        config = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "architectures": ["BertForTokenClassification"]}))
        said = "architectures says BertForTokenClassification, bertkit_task.json a classification model"
    with pytest.raises(BertkitError, match=said):
        export_onnx(ExportSettings(directory, tmp_path / "onnx"))
    assert not (tmp_path / "onnx").exists()


def test_the_directory_appears_whole_or_not_at_all_and_a_killed_exports_leftover_is_removed(tmp_path, classifier_dir,
                                                                                           monkeypatch):
    """model.onnx was written in place and a killed export left its temp directory beside it for good."""
    import bertkit.export.onnx as exporting

    out = tmp_path / "deploy"
    stale = tmp_path / ".deploy.999-export.tmp"  # what an export killed outright leaves
    stale.mkdir()
    (stale / "model.onnx").write_bytes(b"half")

    def failing(*args, **kwargs):
        raise OSError(28, "No space left on device")
    real = exporting.write_deploy_files
    monkeypatch.setattr(exporting, "write_deploy_files", failing)
    with pytest.raises(BertkitError, match="free space"):
        export_onnx(ExportSettings(classifier_dir, out))
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the graph alone nor any temp name
    monkeypatch.setattr(exporting, "write_deploy_files", real)
    export_onnx(ExportSettings(classifier_dir, out))
    assert (out / "model.onnx").is_file() and (out / "bertkit_task.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy"]
    export_onnx(ExportSettings(classifier_dir, out))  # a re-export replaces it
    (out / "notes.txt").write_text("mine")
    with pytest.raises(BertkitError, match=r"holds files an export does not write \(notes.txt\)"):
        export_onnx(ExportSettings(classifier_dir, out))
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("kind", ["the working directory", "a link to a directory"])
def test_an_existing_output_that_cannot_be_renamed_onto_is_written_into(tmp_path, classifier_dir, monkeypatch, kind):
    """`--output .` raised a ValueError traceback (a path of no name), and a link to a directory was replaced by a
    new directory, the link's target keeping the old export."""
    target = tmp_path / "deploy"
    target.mkdir()
    (target / "modules.json").write_text("[]")  # an earlier export's file this one does not write
    (target / ".export.999.tmp").mkdir()  # and what a killed one left
    if kind == "the working directory":
        monkeypatch.chdir(target)
        output = Path(".")
    else:
        output = tmp_path / "link"
        output.symlink_to(target, target_is_directory=True)
    report = export_onnx(ExportSettings(classifier_dir, output))
    assert report.max_abs_diff < 1e-4 and (target / "model.onnx").is_file() and (target / "config.json").is_file()
    assert not (target / "modules.json").exists() and not (target / ".export.999.tmp").exists()
    assert kind == "the working directory" or output.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["deploy"] if kind == "the working directory" else
                                                          ["deploy", "link"])


def test_an_output_holding_the_model_is_refused_never_replaced(tmp_path, classifier_dir):
    """A sentence-transformers directory's 0_BERT/ given as --model, its parent as --output: only names an export
    writes at the top, so the directory (and the model in it) would have been replaced."""
    model = tmp_path / "st" / "0_BERT"
    shutil.copytree(classifier_dir, model)
    with pytest.raises(BertkitError, match="--model .*0_BERT lies inside --output"):
        export_onnx(ExportSettings(model, tmp_path / "st"))
    assert (model / "model.safetensors").is_file()
