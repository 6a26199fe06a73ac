"""Exported directories (`bertkit export onnx`) loaded by the clients users deploy with, in their own virtual
environment: optimum's ORTModelForSequenceClassification / ORTModelForTokenClassification with transformers'
pipelines, SentenceTransformer(DIR, backend="onnx") and OpenVINO's runtime, compared with bertkit's answers on
short texts, texts past the fine-tuned length and past the model's positions, pairs, and text holding
"[MASK]"/"[SEP]".

optimum 2.1 pins transformers < 4.58 while this environment's sentence-transformers needs transformers 5, so the
clients run in a venv (system packages visible, those pins installed over them) built once under
~/.cache/bertkit (or BERTKIT_OPTIMUM_PYTHON names its python); without the package registry the test skips.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.export.onnx import export_onnx
from bertkit.model import BertForSequenceClassification, BertForTokenClassification, BertModel
from bertkit.serve.predictor import load_predictor
from bertkit.settings import ClassificationSettings, ExportSettings
from bertkit.tasks.classification import ClassificationTask
from bertkit.tasks.tagging import TaggingSettings, TaggingTask

from .conftest import TAGS, build

pytestmark = pytest.mark.slow

PINS = ["optimum==2.1.0", "optimum-onnx==0.1.0", "transformers==4.57.6", "sentence-transformers==5.7.0",
        "huggingface_hub==0.36.2", "tokenizers==0.22.2", "datasets==3.6.0", "fsspec==2025.3.0", "openvino>=2025.0"]
LONG = "the cat sat on the mat " * 6  # 38 tokens: past the classifier's 16
PAST_POSITIONS = "the dog ran in the park " * 120  # 722 tokens: past the 128 positions
TEXTS = ["the cat sat on the mat .", LONG, PAST_POSITIONS, "the [MASK] sat [SEP] on the mat"]
PAIRS = [("is paris the capital ?", "paris is the capital of france"), ("the dog", LONG)]  # one side cut: no tie

CLIENT = r'''
import json, sys
import numpy as np
from optimum.onnxruntime import ORTModelForSequenceClassification, ORTModelForTokenClassification
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer, pipeline

cases = json.load(open(sys.argv[1]))
out = {}
for name in ("classifier", "optimized"):
    directory = cases[name]
    model = ORTModelForSequenceClassification.from_pretrained(directory)
    classify = pipeline("text-classification", model=model, tokenizer=AutoTokenizer.from_pretrained(directory),
                        truncation=True, top_k=None)
    inputs = cases["texts"] + [{"text": a, "text_pair": b} for a, b in cases["pairs"]]
    out[name] = [{r["label"]: r["score"] for r in result} for result in classify(inputs)]
tokenizer = AutoTokenizer.from_pretrained(cases["tagger"])
tagger = ORTModelForTokenClassification.from_pretrained(cases["tagger"])
batch = tokenizer(cases["texts"], truncation=True, padding=True, return_tensors="np")
out["tagger"] = {"input_ids": batch["input_ids"].tolist(), "attention_mask": batch["attention_mask"].tolist(),
                 "logits": tagger(**batch).logits.tolist()}
out["sentence"] = SentenceTransformer(cases["sentence"], backend="onnx", device="cpu").encode(cases["texts"]).tolist()
import openvino  # OpenVINO's runtime reads the same graph
core = openvino.Core()
# f32: OpenVINO's CPU plugin computes in bf16 by default on CPUs that have it (2e-4 from fp32 here)
compiled = core.compile_model(core.read_model(cases["classifier"] + "/model.onnx"), "CPU",
                              {"INFERENCE_PRECISION_HINT": "f32"})
batch = AutoTokenizer.from_pretrained(cases["classifier"])(cases["texts"], truncation=True, padding=True,
                                                            return_tensors="np")
logits = compiled(dict(batch))[compiled.output("logits")]
out["openvino"] = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).tolist()
json.dump(out, open(sys.argv[2], "w"))
'''


@pytest.fixture(scope="session")
def client_python() -> str:
    """The python of a venv with optimum's pins, built once (atomically) under ~/.cache/bertkit."""
    given = os.environ.get("BERTKIT_OPTIMUM_PYTHON")
    if given:
        return given
    pins = hashlib.sha256(" ".join(PINS).encode()).hexdigest()[:8]  # new pins: a new venv
    venv = Path.home() / ".cache" / "bertkit" / f"optimum-venv-{pins}"
    python = venv / "bin" / "python"
    if not python.exists():
        building = venv.with_name(f"{venv.name}.building-{os.getpid()}")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(building)], check=True)
        installed = subprocess.run([str(building / "bin" / "python"), "-m", "pip", "install", "-q", *PINS],
                                   capture_output=True, text=True, timeout=900)
        if installed.returncode != 0:
            shutil.rmtree(building, ignore_errors=True)
            pytest.skip(f"could not install optimum's pins (no package registry?): {installed.stderr[-300:]}")
        try:
            building.rename(venv)  # a venv's python works from its new path (the scripts' shebangs do not)
        except OSError:  # another run built it meanwhile
            shutil.rmtree(building, ignore_errors=True)
    return str(python)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """A classifier (fine-tuned length 16), its --optimize export, a tagger and a sentence-transformers encoder,
    each exported as a directory."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    root = tmp_path_factory.mktemp("optimum")
    labels = ["negative", "positive", "neutral"]
    task = ClassificationTask(ClassificationSettings(labels=labels, max_seq_length=16))
    classifier = build(root / "cls", BertForSequenceClassification, task.to_json(), num_labels=3,
                       id2label=dict(enumerate(labels)))
    tagging = TaggingTask(TaggingSettings(labels=TAGS, max_seq_length=16))
    tagger = build(root / "tag", BertForTokenClassification, tagging.to_json(), num_labels=len(TAGS),
                   id2label=dict(enumerate(TAGS)))
    transformer = Transformer(str(build(root / "enc", BertModel)), max_seq_length=12)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), "mean"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(root / "st"))
    shutil.copy(root / "enc" / "vocab.txt", root / "st" / "vocab.txt")
    # sentence-transformers 6 names its modules where 5 (the venv's) cannot import them; the classic names load in both
    modules_json = json.loads((root / "st" / "modules.json").read_text())
    for module in modules_json:
        module["type"] = "sentence_transformers.models." + module["type"].rpartition(".")[2]
    (root / "st" / "modules.json").write_text(json.dumps(modules_json))
    sources = {"classifier": classifier, "tagger": tagger, "sentence": root / "st"}
    out = {name: root / f"{name}-onnx" for name in sources}
    for name, source in sources.items():
        export_onnx(ExportSettings(source, out[name]))
    out["optimized"] = root / "optimized-onnx"
    export_onnx(ExportSettings(classifier, out["optimized"], optimize=True))
    return {**out, **{f"{name}-source": source for name, source in sources.items()}}


def test_optimum_pipelines_and_sentence_transformers_onnx_answer_as_bertkit(client_python, exported, tmp_path):
    cases = {"texts": TEXTS, "pairs": PAIRS, **{k: str(v) for k, v in exported.items()}}
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "client.py").write_text(CLIENT)
    run = subprocess.run([client_python, str(tmp_path / "client.py"), str(tmp_path / "cases.json"),
                          str(tmp_path / "out.json")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    answers = json.loads((tmp_path / "out.json").read_text())

    classifier = load_predictor(exported["classifier-source"])
    expected = classifier.classify(TEXTS) + classifier.classify([a for a, _ in PAIRS], [b for _, b in PAIRS])
    for name, tolerance in (("classifier", 1e-5), ("optimized", 1e-4)):  # fused kernels round differently
        for i, (got, want) in enumerate(zip(answers[name], expected, strict=True)):
            assert got.keys() == want["probabilities"].keys(), (name, i)
            for label, probability in want["probabilities"].items():
                assert got[label] == pytest.approx(probability, abs=tolerance), (name, i, label)

    tagger = BertForTokenClassification.from_pretrained(exported["tagger-source"]).eval()
    batch = {k: torch.tensor(answers["tagger"][k]) for k in ("input_ids", "attention_mask")}
    assert batch["input_ids"].shape[1] == 16  # the tagger's fine-tuned length, read from tokenizer_config.json
    with torch.no_grad():
        logits = tagger(**batch).logits.numpy()
    mask = batch["attention_mask"].numpy().astype(bool)
    np.testing.assert_allclose(np.array(answers["tagger"]["logits"])[mask], logits[mask], atol=1e-4)

    vectors = load_predictor(exported["sentence-source"]).embed(TEXTS)
    np.testing.assert_allclose(answers["sentence"], vectors, atol=1e-5)

    for got, want in zip(answers["openvino"], expected[:len(TEXTS)], strict=True):  # label order = id order
        np.testing.assert_allclose(got, list(want["probabilities"].values()), atol=1e-5)
