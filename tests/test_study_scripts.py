"""The issue 17 study scripts on a tiny fake WordNet (and fake dictd dictionaries) written here:
scripts/study_data.py builds files that bertkit's own readers load (lexname tables, SQuAD JSON whose every
answer_start slices to its answer, a corpus `bertkit data pretraining` takes), holds every dev/test synset
out of the corpus, is deterministic, and keeps dev/test fixed when the training set grows;
scripts/study_finetune.py runs the grid learning-rate rule end to end on a `bert-debug` model and pairs
result rows into the study table."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bertkit.cli import main as bertkit_main
from bertkit.config import load_config
from bertkit.data import PretrainingDataset
from bertkit.data.corpus import CorpusStats, read_documents
from bertkit.data.glue import read_table
from bertkit.data.squad import read_squad
from bertkit.model import BertForMaskedLM, read_state_dict
from bertkit.tokenizer import WordPieceTokenizer

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
NOUNS = ("dog", "cat", "horse", "table", "chair", "lamp", "river", "hill", "storm", "bread", "apple", "stone",
         "boat", "road", "tower", "garden", "letter", "song", "market", "window", "bridge", "cloud", "forest",
         "candle", "mirror", "basket", "ladder", "kettle", "anchor", "saddle", "harbor", "meadow", "lantern",
         "pillow", "blanket", "bucket", "hammer", "needle", "feather", "pebble")
VERBS = ("run", "walk", "swim", "jump", "sing", "paint", "build", "carry", "climb", "throw", "catch", "bake")
ADJECTIVES = ("quick", "slow", "bright", "dark", "warm", "cold", "heavy", "light")
ADVERBS = ("quickly", "slowly", "brightly", "warmly", "loudly", "softly")


def _line(offset: int, lexnum: int, ss_type: str, words: list[str], pointers: list[tuple[str, int, str]],
          gloss: str, frames: str = "") -> str:
    ptrs = " ".join(f"{sym} {target:08d} {pos} 0000" for sym, target, pos in pointers)
    word_part = " ".join(f"{w} 0" for w in words)
    return (f"{offset:08d} {lexnum:02d} {ss_type} {len(words):02x} {word_part} {len(pointers):03d}"
            f"{' ' + ptrs if ptrs else ''}{frames} | {gloss}  ")


def write_fake_wordnet(directory: Path) -> Path:
    """data.noun/verb/adj/adv in WordNet 3.0's layout: a licence header, hypernyms, instance hypernyms,
    verb frames, adjective heads with satellites, adjective markers, glosses with and without examples,
    two synsets sharing one definition."""
    directory.mkdir(parents=True)
    header = "  1 This software and database is being provided to you, the LICENSEE, by  \n"
    rng = random.Random(0)
    nouns = [_line(1000, 3, "n", ["entity"], [], "that which exists")]
    for i, word in enumerate(NOUNS):
        lexnum = (5, 6, 17, 13)[i % 4]  # animal, artifact, object, food
        parent = 1000 if i < 4 else 1000 + 10 * (1 + i % 4)
        example = f'; "the {word} near the {rng.choice(NOUNS)} was old"' if i % 5 else ""
        definition = "a thing of some kind" if i in (7, 8) else f"a {word} kind of thing number {i}"
        symbol = "@i" if i % 7 == 0 else "@"
        nouns.append(_line(1000 + 10 * (i + 1), lexnum, "n", [word, f"{word}_thing"], [(symbol, parent, "n")],
                           definition + example))
    verbs = [_line(5000 + 10 * i, 38 if i % 2 else 36, "v", [word], [("@", 5000, "v")] if i else [],
                   f'to {word} somewhere in manner {i}; "they {word} every day"; "we {word} at noon"',
                   frames=" 01 + 02 00")
             for i, word in enumerate(VERBS)]
    adjs = []
    for i, word in enumerate(ADJECTIVES):
        offset = 7000 + 10 * i
        if i % 2 == 0:
            adjs.append(_line(offset, 0, "a", [f"{word}(a)"], [("&", offset + 10, "s")],
                              f'having the quality {word} {i}; "a {word} day"'))
        else:
            adjs.append(_line(offset, 0, "s", [word], [("&", offset - 10, "a")], f'rather {word} {i}; "so {word} now"'))
    advs = [_line(9000 + 10 * i, 2, "r", [word], [], f'in a {word} way {i}; "she spoke {word} then"')
            for i, word in enumerate(ADVERBS)]
    for name, lines in (("noun", nouns), ("verb", verbs), ("adj", adjs), ("adv", advs)):
        (directory / f"data.{name}").write_text(header + "\n".join(lines) + "\n", encoding="utf-8")
    return directory


def _b64(number: int) -> str:
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = ""
    while True:
        out, number = digits[number % 64] + out, number // 64
        if not number:
            return out


def write_fake_dictd(directory: Path) -> Path:
    """jargon and devil dictionaries in dictd's layout (.dict.dz is gzip; the .index gives base64 offsets)."""
    directory.mkdir(parents=True)
    entries = {"jargon": ["00-database-info\n  A header entry.\n", "foo\n /foo/, n.\n\n    A metasyntactic word. It is "
                          "used everywhere, see {bar}.\n\n    Second paragraph here.\n", "bar\n //\n\n    See foo.\n"],
               "devil": ["ABSENT, adj.  Peculiarly exposed to tribulation.  Here is a second sentence.\n",
                         "ABSURDITY, n.  A statement of opinion.\n"]}
    for name, texts in entries.items():
        data, index, at = "", [], 0
        for text in texts:
            word = text.split("\n")[0].split(",")[0]
            index.append(f"{word}\t{_b64(at)}\t{_b64(len(text.encode()))}")
            data += text
            at += len(text.encode())
        (directory / f"{name}.dict.dz").write_bytes(gzip.compress(data.encode(), mtime=0))
        (directory / f"{name}.index").write_text("\n".join(index) + "\n", encoding="utf-8")
    return directory


def load_script(name: str):
    if str(SCRIPTS) not in sys.path:  # as `python scripts/NAME.py` has it: the scripts import their shared helpers
        sys.path.append(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(f"study_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SIZES = ["--lexname-train", "12", "--lexname-dev", "6", "--lexname-test", "6", "--qa-train", "8", "--qa-dev", "4",
         "--qa-test", "4", "--qa-paragraph", "2", "--doc-synsets", "5", "--doc-min-lines", "3"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    wordnet, dictd = write_fake_wordnet(root / "wn"), write_fake_dictd(root / "dictd")
    study_data = load_script("study_data")
    manifest = study_data.main(["--wordnet", str(wordnet), "--dictd", str(dictd), "--output", str(root / "out"),
                                *SIZES])
    return root, manifest, study_data


def test_lexname_files_load_with_bertkit_readers(built):
    root, manifest, _ = built
    wordnet = root / "out" / "wordnet"
    train_labels = {e.label for e in read_table(wordnet / "lexname-train.tsv", "text", None, "label")[0]}
    for split, asked in (("train", 12), ("dev", 6), ("test", 6)):
        tsv, skipped = read_table(wordnet / f"lexname-{split}.tsv", "text", None, "label")
        jsonl, _ = read_table(wordnet / f"lexname-{split}.jsonl", "text", None, "label")
        assert not skipped and [(e.text, e.label, e.id) for e in tsv] == [(e.text, e.label, e.id) for e in jsonl]
        assert {e.label for e in tsv} <= train_labels
        report = manifest["lexname"][split]
        assert report["rows"] == len(tsv) and report["rows"] + report["dropped_unseen_label"] == asked


def test_qa_files_are_squad_with_exact_answers(built):
    root, manifest, _ = built
    ids = []
    for split, asked in (("train", 8), ("dev", 4), ("test", 4)):
        examples, skipped = read_squad(root / "out" / "wordnet" / f"qa-{split}.json", training=True,
                                       version_2_with_negative=False)
        assert not skipped and len(examples) == asked == manifest["qa"][split]["questions"]
        for example in examples:
            (text, start), = example.answers
            assert example.context[start:start + len(text)] == text
            assert example.question.startswith("Which word means: ")
        ids.append({e.qid for e in examples})
    assert not ids[1] & ids[2] and not (ids[1] | ids[2]) & ids[0]


def test_corpus_reads_and_holds_out_every_dev_and_test_text(built):
    root, manifest, study_data = built
    out = root / "out"
    documents = list(read_documents([out / "wordnet" / "corpus.txt"], CorpusStats(), strict=True))
    assert len(documents) == manifest["corpus"]["documents"] > 1
    assert all(len(document) >= 3 for document in documents[:-1])  # neighbourhoods packed to --doc-min-lines
    corpus = "\n".join(line for document in documents for line in document)
    synsets = {s.key: s for s in study_data.read_wordnet(root / "wn")}
    held = {e.id for split in ("dev", "test") for e in read_table(out / "wordnet" / f"lexname-{split}.jsonl", "text",
                                                                   None, "label")[0]}
    held |= {qa["id"] for split in ("dev", "test") for p in json.loads(
        (out / "wordnet" / f"qa-{split}.json").read_text())["data"][0]["paragraphs"] for qa in p["qas"]}
    dropped = sum(manifest["lexname"][split]["dropped_unseen_label"] for split in ("dev", "test"))
    assert len(held) + dropped == manifest["wordnet"]["held_out_synsets"] == 6 + 6 + 4 + 4
    lines = set(corpus.split("\n"))
    for key in held:
        assert synsets[key].definition not in corpus and not set(synsets[key].examples) & lines
    dictionaries = list(read_documents([out / "dictionaries" / "corpus.txt"], CorpusStats(), strict=True))
    assert dictionaries == [["foo: A metasyntactic word.", "It is used everywhere, see bar.", "Second paragraph here."],
                            ["bar: See foo."],  # the jargon file's last document; none spans two dictionaries
                            ["ABSENT, adj. Peculiarly exposed to tribulation.", "Here is a second sentence.",
                             "ABSURDITY, n. A statement of opinion."]]
    assert manifest["files"]["wordnet/corpus.txt"]["sha256"]


def test_corpus_becomes_pretraining_data(built, tmp_path):
    root, _, _ = built
    corpus = root / "out" / "wordnet" / "corpus.txt"
    WordPieceTokenizer.train([corpus], vocab_size=150, min_frequency=1).save_pretrained(tmp_path / "vocab")
    code = bertkit_main(["data", "pretraining", "--input", str(corpus), "--tokenizer", str(tmp_path / "vocab"),
                         "--output", str(tmp_path / "data"), "--max-seq-length", "32", "--masking", "dynamic",
                         "--workers", "1", "--quiet"])
    assert code in (0, None) and len(PretrainingDataset(tmp_path / "data")) > 0


def test_deterministic_and_train_size_keeps_dev_and_test(built, tmp_path):
    root, manifest, study_data = built
    again = study_data.main(["--wordnet", str(root / "wn"), "--dictd", str(root / "dictd"), "--output",
                             str(tmp_path / "again"), *SIZES])
    assert again["files"] == manifest["files"]
    bigger = SIZES.copy()
    bigger[1] = "20"
    study_data.main(["--wordnet", str(root / "wn"), "--output", str(tmp_path / "big"), *bigger])
    old, new = root / "out" / "wordnet", tmp_path / "big" / "wordnet"
    small_train = (old / "lexname-train.tsv").read_text().splitlines()
    assert (new / "lexname-train.tsv").read_text().splitlines()[:len(small_train)] == small_train
    for name in ("lexname-test.tsv", "qa-dev.json", "qa-test.json", "corpus.txt"):
        assert (old / name).read_bytes() == (new / name).read_bytes()


def test_finetune_grid_rule_and_table(built, tmp_path):
    root, _, _ = built
    corpus = root / "out" / "wordnet" / "corpus.txt"
    WordPieceTokenizer.train([corpus], vocab_size=150, min_frequency=1).save_pretrained(tmp_path / "vocab")
    study = load_script("study_finetune")
    results = tmp_path / "results.jsonl"
    common = ["--data", str(root / "out"), "--random", "bert-debug", "--tokenizer", str(tmp_path / "vocab"),
              "--seeds", "1,2", "--epochs", "1", "--precision", "fp32", "--results", str(results)]
    row = study.run(study.parse_args(["run", "--task", "wordnet-lexname", "--lr-grid", "1e-3,3e-3",
                                      "--output", str(tmp_path / "lexname"), *common]))
    assert set(row["lr_grid"]) == {"0.001", "0.003"} and row["learning_rate"] == max(
        (1e-3, 3e-3), key=lambda lr: row["lr_grid"][f"{lr:g}"])
    assert row["seeds"]["1"]["dev"] == row["lr_grid"][f"{row['learning_rate']:g}"]  # seed 1 reused, not rerun
    assert set(row["seeds"]) == {"1", "2"} and row["finetune_runs"] == 3 and 0 <= row["test"]["mean"] <= 100
    assert not list((tmp_path / "lexname").glob("lr-*/best"))  # weights dropped once the row is written
    qa = study.run(study.parse_args(["run", "--task", "wordnet-qa", "--lr-rule", "fixed", "--learning-rate", "1e-3",
                                     "--max-seq-length", "128",
                                     "--output", str(tmp_path / "qa"), *common, "--seeds", "1"]))
    assert qa["metric"] == "f1" and qa["finetune_runs"] == 1 and qa["train_examples"] == 8
    default = study.run(study.parse_args(["run", "--task", "wordnet-lexname", "--lr-rule", "default",
                                          "--output", str(tmp_path / "default"), *common, "--seeds", "1"]))
    assert default["learning_rate"] > 0 and default["recipe_finetune"]["lr_rule"] == "default"
    shifted = {seed: {**scores, "test": scores["test"] + 7.0 + int(seed)} for seed, scores in row["seeds"].items()}
    pretrained = {**row, "init": "pretrained", "corpus": "wordnet", "budget": "10m", "recipe": "auto",
                  "mlm_accuracy": 0.25, "test": {"mean": row["test"]["mean"] + 7.0, "std": 1.0}, "seeds": shifted}
    longer = {**row, "recipe_finetune": {**row["recipe_finetune"], "epochs": 9.0}, "test": {"mean": 99.0, "std": 0.0}}
    with open(results, "a") as handle:  # a random row fine-tuned otherwise is no baseline for it
        handle.write(json.dumps(pretrained) + "\n" + json.dumps(longer) + "\n")
    table = study.markdown_table(study.read_rows([results]))
    line = next(line for line in table.splitlines() if "| wordnet | 10m |" in line)
    assert "| 25.0 |" in line and "| +7.0 | " in line
    from bertkit.workflows.significance import compare_seeds  # the gain's p over the seeds, Welch's

    expected = compare_seeds([s["test"] for s in shifted.values()], [s["test"] for s in row["seeds"].values()])
    assert expected.p_value is not None and line.endswith(f"| {expected.p_value:.2g} |")
    # fine-tuned on other files (a rebuilt task, the whole train file instead of the study's subset): no baseline
    assert set(row["data_sha256"]) == {"train", "dev", "test"}
    rebuilt = {**pretrained, "budget": "20m", "data_sha256": {**row["data_sha256"], "train": "0" * 64}}
    with open(results, "a") as handle:
        handle.write(json.dumps(rebuilt) + "\n")
    table = study.markdown_table(study.read_rows([results]))
    assert "| n/a | n/a |" in next(line for line in table.splitlines() if "| wordnet | 20m |" in line)


def test_a_study_row_measures_the_model_it_names(tmp_path, monkeypatch):
    """A study row fine-tunes the model it names: never random initialisation in its place, which
    `--compare-random-init auto` keeps where a short pre-training loses on long inputs."""
    import argparse

    import bertkit.workflows.finetune as finetuning

    study = load_script("study_finetune")
    seen = []
    monkeypatch.setattr(finetuning, "run_finetuning", lambda kind, train, devs, cfg, options: seen.append(cfg) or {})
    args = argparse.Namespace(task="mhcc-part", epochs=10.0, batch_size=None, precision=None, output=tmp_path,
                              tokenizer=None, random=None, model=tmp_path / "model", device="cpu", max_seq_length=None)
    study.finetune_at(args, (tmp_path / "train", tmp_path / "dev", tmp_path / "test"), None, (1, 2, 3))
    assert [cfg.compare_random_init for cfg in seen] == ["off"]


def test_finetune_flags_are_checked(tmp_path):
    study = load_script("study_finetune")
    with pytest.raises(SystemExit):
        study.parse_args(["run", "--task", "kjv-verse", "--random", "bert-mini", "--output", "o", "--results", "r"])
    with pytest.raises(SystemExit):
        study.parse_args(["run", "--task", "kjv-verse", "--model", "m", "--lr-rule", "fixed", "--output", "o",
                          "--results", "r"])


def test_kjv_tagging_files_tag_names_by_the_corpus_rule(tmp_path, monkeypatch):
    """scripts/kjv_tagging_files.py (the int8 tagger's data): every verse of the bundled splits, as CoNLL that
    `bertkit finetune tagging` reads; a capitalised word is a name only if it never occurs lower-case."""
    from bertkit.data.conll import read_conll

    monkeypatch.chdir(tmp_path)
    subprocess.run([sys.executable, str(SCRIPTS / "kjv_tagging_files.py")], check=True, timeout=120)
    sentences = {split: read_conll(tmp_path / f"{split}.conll", scheme="BIO") for split in ("train", "dev", "test")}
    assert [len(s) for s in sentences.values()] == [4000, 1000, 1000]
    tags = {(w, t) for s in sentences["train"] for w, t in zip(s.words, s.labels or [])}
    assert ("Jerusalem", "B-NAME") in tags and ("Let", "O") in tags and ("I", "O") in tags
    assert not any(w[0].islower() and t != "O" for w, t in tags)
    assert any(t == "I-NAME" for _, t in tags)  # names side by side are one entity


def test_the_lever_study_changes_one_thing_per_run_at_the_same_cpu_budget(tmp_path):
    """scripts/pretraining_study.py run --levers (issue 37, item 2): every lever is one pre-training of the short
    recipe with its one flag (or its own data), at 10 CPU-minutes turned into steps by its sequence length's rate,
    fine-tuned on both held-out tasks; without --levers the study is unchanged."""
    import argparse

    study = load_script("pretraining_study")
    args = argparse.Namespace(root=tmp_path, data=tmp_path / "d", rate_64=2.0, rate_128=1.0, levers=True)
    jobs = {job.name: job for job in study.jobs(args)}
    plain = {job.name for job in study.jobs(argparse.Namespace(**{**vars(args), "levers": False}))}
    assert plain < set(jobs)
    for lever, (flags, source, length, *factor) in study.LEVERS.items():
        job = jobs[f"wordnet:pretrain:{lever}:10"]
        command = job.command[job.command.index("pretrain"):]
        assert command[command.index("--recipe") + 1] == "auto" and all(flag in command for flag in flags)
        steps = 10 * 60 * (2 if length == "64" else 1) * (factor[0] if factor else 1)
        assert command[command.index("--max-steps") + 1] == str(round(steps))
        data = command[command.index("--data") + 1]
        assert data.endswith("/data" if source == "data" else f"/data-{source}")
        assert job.after == [f"wordnet:{'data' if source == 'data' else 'data-' + source}"]
        for task in ("wordnet-lexname", "wordnet-qa"):
            assert jobs[f"wordnet:finetune:{lever}:10:{task}"].after == [job.name]
    contiguous = jobs["wordnet:data-contiguous"].command
    assert contiguous[contiguous.index("--packing") + 1] == "contiguous" and "--no-nsp" in contiguous
    assert "--no-nsp" in jobs["wordnet:pretrain:contiguous:10"].command  # its data has no NSP pairs
    mask30 = jobs["wordnet:pretrain:mask30:10"].command  # the lever replaces the recipe-before's value
    assert mask30.count("--masked-lm-prob") == 1 and mask30[mask30.index("--masked-lm-prob") + 1] == "0.3"
    before = jobs["wordnet:pretrain:before:10"].command  # the recipe before issue 37, pinned by flags
    assert [before[before.index(flag) + 1] for flag in study.LEVER_BASE] == ["32", "0.15", "0.05"]
    auto = jobs["wordnet:pretrain:auto:10"].command  # today's recipe at its own batch: the same tokens per CPU-second
    assert auto[auto.index("--max-steps") + 1] == str(round(10 * 60 * 2.0 * 32 / study.SHORT_BATCH))
    batch16 = jobs["wordnet:pretrain:batch16:10"].command  # half the batch, twice the steps: the same tokens
    assert batch16[batch16.index("--max-steps") + 1] == "2400"
    assert batch16[batch16.index("--global-batch-size") + 1] == "16"
    vocab = jobs["wordnet:vocab4000"].command
    assert vocab[vocab.index("--vocab-size") + 1] == "4000"


def test_the_linear_probe_reads_every_layer_of_a_frozen_encoder(tmp_path, monkeypatch, capsys):
    """scripts/linear_probe.py: one score per layer and pooling; a topic a word decides is read off the embeddings
    of even a random encoder (each class has its own words), and a row is appended with --results."""
    words = {"zool": ["fin", "claw", "beak", "hoof"], "bot": ["leaf", "root", "stem", "seed"]}
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "of", "a"] + [w for ws in words.values() for w in ws]
    (vocab / "vocab.txt").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    (vocab / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}), encoding="utf-8")
    rng = random.Random(0)
    task = tmp_path / "task"
    task.mkdir()
    for split, count in (("train", 40), ("test", 20)):
        rows = []
        for i in range(count):
            label = ("zool", "bot")[i % 2]
            text = " ".join(rng.choice(words[label] + ["the", "of", "a"]) for _ in range(12))
            rows.append(json.dumps({"text": text, "label": label}))
        (task / f"{split}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    probe = load_script("linear_probe")
    results = tmp_path / "rows.jsonl"
    monkeypatch.setattr(sys, "argv", ["linear_probe.py", "--task", str(task), "--random", "bert-debug", "--tokenizer",
                                      str(vocab), "--max-seq-length", "16", "--results", str(results)])
    probe.main()
    line = capsys.readouterr().out.strip().splitlines()[-1]
    scores = dict(item.split("=") for item in line.split()[1:])
    assert line.startswith("random-bert-debug ")
    assert set(scores) == {f"L{layer}{pooling}" for layer in range(3) for pooling in ("mean", "cls")}
    assert float(scores["L0mean"]) >= 90.0
    row = json.loads(results.read_text(encoding="utf-8"))
    assert row["probe"]["L0mean"] == float(scores["L0mean"]) and row["max_seq_length"] == 16


def check_task_build(tmp_path: Path, build) -> tuple[dict, dict[str, list[dict]], str]:
    """Build into tmp_path/a with --train 100 and tmp_path/b with --train 10 (`build(out, train)`): no dev/test text
    reaches the corpus, every training text does, and dev and test do not change with --train. Returns a's
    (manifest, rows per split, corpus)."""
    manifest = build(tmp_path / "a", 100)
    rows = {s: [json.loads(x) for x in (tmp_path / "a" / f"{s}.jsonl").read_text().splitlines()]
            for s in ("train", "dev", "test")}
    corpus = (tmp_path / "a" / "corpus.txt").read_text()
    assert all(r["text"] not in corpus.replace("\n", " ") for s in ("dev", "test") for r in rows[s])
    assert all(r["text"] in corpus.replace("\n", " ") for r in rows["train"])
    build(tmp_path / "b", 10)
    for split in ("dev", "test"):
        assert (tmp_path / "a" / f"{split}.jsonl").read_bytes() == (tmp_path / "b" / f"{split}.jsonl").read_bytes()
    return manifest, rows, corpus


def test_commentary_task_holds_dev_and_test_out_of_its_corpus(tmp_path, monkeypatch):
    """scripts/mhcc_task_data.py (the length study's never-used family): every book has a part; a comment is cut
    at its verse markers, the outline before the first goes to the corpus only; short sections are skipped and
    counted; no dev/test section reaches the corpus; splits are deterministic and dev/test fixed under --train."""
    monkeypatch.syspath_prepend(str(SCRIPTS))  # it reuses scripts/gcide_task_data.py's helpers
    mhcc = load_script("mhcc_task_data")
    assert len(mhcc.GROUP_OF) == 66 and len(set(mhcc.GROUPS)) == 8
    outline, parts = mhcc.sections("The first sabbath.(1-3) The garden.(4-7) Verses 1-3 After six days God "
                                   "ceased. Verse 4 Here is a name. Verses 5, 6 And more.")
    assert outline == "The first sabbath.(1-3) The garden.(4-7)"
    assert parts == ["After six days God ceased.", "Here is a name.", "And more."]
    rng = random.Random(0)
    words = NOUNS + VERBS + ADJECTIVES

    def comment(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."

    books = sorted(mhcc.GROUP_OF)
    comments = [(book, f"Outline of {book}.(1-9) Verses 1-4 {comment(30 + i % 40)} Verses 5-9 {comment(8)}")
                for i, book in enumerate(books * 3)]
    monkeypatch.setattr(mhcc, "read_comments", lambda module: (comments, __import__("collections").Counter()))

    def build(out: Path, train: int) -> dict:
        return mhcc.main(["--module", "m", "--output", str(out), "--train", str(train), "--dev", "20",
                          "--test", "30", "--min-words", "40"])

    manifest, rows, corpus = check_task_build(tmp_path, build)
    counts = manifest["counts"]
    assert counts["sections under 40 words (skipped)"] == counts["sections"] - manifest["eligible"]
    assert all(len(r["text"].split()) >= 40 and r["label"] in mhcc.GROUPS for split in rows.values() for r in split)
    assert "Outline of Gen.(1-9)" in corpus


def test_psalter_task_removes_what_names_its_label_and_holds_dev_and_test_out(tmp_path, monkeypatch):
    """scripts/tdavid_task_data.py (a never-used long-input family): each paragraph loses its verse marker, its
    closing attribution and psalm numbers (they would name the book); short ones are skipped and counted; the corpus
    has one document per psalm and no dev/test paragraph; dev and test do not change with --train."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    tdavid = load_script("tdavid_task_data")
    assert sorted(tdavid.BOOK_OF) == list(range(1, 151)) and tdavid.BOOK_OF[119] == "V" and tdavid.BOOK_OF[41] == "I"
    counts = __import__("collections").Counter()
    text = tdavid.clean("Ver. 115. Depart from me, as in Psalm 6:8 and Ps. 119 — he said. —Thomas Manton, on the "
                        "Hundred and Nineteenth Psalm, 1681.", 25, counts)
    assert text == "Depart from me, as in Psalm and Ps. — he said."
    assert counts["attributions removed"] == 1 and counts["psalm numbers removed"] == 2
    assert tdavid.clean("Verses 3-5. A long — dash " + "word " * 30, 25, counts).startswith("A long — dash")
    rng = random.Random(0)
    words = NOUNS + VERBS + ADJECTIVES

    def paragraph(n: int) -> str:
        return "Verse 1. " + " ".join(rng.choice(words) for _ in range(n)).capitalize() + ". —A. Writer, 1660."

    entries = ["   ".join(paragraph(20 + (psalm * k) % 50) for k in range(3)) for psalm in range(1, 151)]

    def build(out: Path, train: int) -> dict:
        return tdavid.main(["--module", "m", "--output", str(out), "--train", str(train), "--dev", "20",
                            "--test", "30", "--min-words", "40"], entries=entries)

    manifest, rows, corpus = check_task_build(tmp_path, build)
    assert manifest["counts"]["paragraphs under 40 words (skipped)"] == 450 - manifest["eligible"]
    assert all(len(r["text"].split()) >= 40 and r["label"] in tdavid.BOOKS for split in rows.values() for r in split)
    assert not any("Verse" in r["text"] or "Writer" in r["text"] for split in rows.values() for r in split)
    assert corpus.count("\n\n") == 150  # one document per psalm


def test_bible_passage_task_joins_verses_and_holds_dev_and_test_out(tmp_path, monkeypatch):
    """scripts/web_task_data.py (the family built after every setting was chosen): a verse's OSIS text loses its
    footnotes, markup and the module's appended glossary, with no space left where a word tag stood; a chapter's
    verses join into passages of at least --min-words words, its short end goes to the corpus only (counted); the
    corpus has one document per chapter and no dev/test passage; dev and test do not change with --train."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    web = load_script("web_task_data")
    raw = ('<div type="x-p"/><w lemma="strong:H0430">God</w> <w lemma="strong:H0559">said</w>, “<w>Let</w> '
           '<w>there</w> <w>be</w> <w>light</w>,”<note placement="foot"><reference>1:3 </reference>Or, lamp</note> '
           '<w>and</w> <w>there</w> <w>was</w> <w>light</w>. World English Bible Glossary abba Abba is Aramaic.')
    assert web.clean_verse(raw) == "God said, “Let there be light,” and there was light."
    assert web.passages(["a b c", "d e", "f g h i", "j"], 4) == (["a b c d e", "f g h i"], "j")
    rng = random.Random(0)
    words = NOUNS + VERBS + ADJECTIVES
    chapters = [(book, number, [" ".join(rng.choice(words) for _ in range(7)).capitalize() + "."
                                for _ in range(3 + (number * 5) % 11)])
                for book in sorted(web.GROUP_OF) for number in (1, 2)]
    monkeypatch.setattr(web, "read_chapters", lambda module: (chapters, __import__("collections").Counter()))

    def build(out: Path, train: int) -> dict:
        return web.main(["--module", "m", "--output", str(out), "--train", str(train), "--dev", "20",
                         "--test", "30", "--min-words", "20"])

    manifest, rows, corpus = check_task_build(tmp_path, build)
    counts = manifest["counts"]
    assert manifest["eligible"] == counts["passages"] == sum(len(v) // 3 for _, _, v in chapters)
    assert counts["chapter ends under 20 words (corpus only)"] == sum(len(v) % 3 > 0 for _, _, v in chapters)
    assert all(20 <= len(r["text"].split()) <= 27 and r["label"] in web.GROUP_OF.values()
               for split in rows.values() for r in split)
    assert corpus.count("\n\n") == len(chapters)  # one document per chapter (none is wholly held out here)


def test_transformers_comparison_trains_the_objective_bertkits_recipe_trains(tmp_path):
    """The transformers row of the study must train what bertkit's run of the same steps trains: masked LM only
    from the short recipe's threshold, and then the same loss as bertkit's on the same weights and batch."""
    import contextlib

    import torch
    import transformers

    from bertkit.config import preset
    from bertkit.data import collate_pretraining
    from bertkit.model import BertForMaskedLM, BertForPreTraining
    from bertkit.model.hf_names import to_hf
    from bertkit.tasks.pretraining import pretraining_loss
    script = load_script("transformers_pretrain")
    recipe_nsp = script.short_recipe(256, budget_steps=2640).nsp  # masked LM only, as bertkit's short recipe
    assert script.objective(recipe_nsp, True, None) is False and script.objective(recipe_nsp, True, True) is True
    assert script.objective(True, True, None) is True and script.objective(True, False, None) is False
    with pytest.raises(SystemExit, match="--no-nsp"):
        script.objective(recipe_nsp, False, True)
    config = preset("bert-tiny", vocab_size=50, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    pairs = {nsp: (script.bertkit_model(config, nsp), script.transformers_model(config, nsp)) for nsp in (True, False)}
    assert isinstance(pairs[False][0], BertForMaskedLM) and isinstance(pairs[False][1], transformers.BertForMaskedLM)
    assert isinstance(pairs[True][0], BertForPreTraining)
    for ours, theirs in pairs.values():
        missing, unexpected = theirs.load_state_dict(to_hf(ours.state_dict()), strict=False)
        assert not unexpected and all("position_ids" in key or "decoder" in key for key in missing)
        theirs.tie_weights()
        ours.eval(), theirs.eval()
    generator = torch.Generator().manual_seed(1)
    items = []
    for length in (12, 9):
        ids = torch.randint(5, 50, (length,), generator=generator)
        labels = torch.full((length,), -100)
        labels[torch.tensor([2, 5, 7])] = torch.randint(5, 50, (3,), generator=generator)
        items.append({"input_ids": ids, "token_type_ids": torch.zeros(length, dtype=torch.long),
                      "attention_mask": torch.ones(length, dtype=torch.long), "mlm_labels": labels,
                      "nsp_labels": torch.tensor(1)})
    batch = collate_pretraining(items)
    with torch.no_grad():
        ours, theirs = pairs[False]
        expected = pretraining_loss(ours, batch, nsp=False)[0]
        assert torch.allclose(script.transformers_mlm_loss(theirs, batch), expected, atol=1e-5)
        ours, theirs = pairs[True]
        assert torch.allclose(script.transformers_loss(theirs, batch), pretraining_loss(ours, batch)[0], atol=1e-5)
    for nsp in (True, False):  # both sides time the run's objective on the same batches
        timing = script.rate_ratio(config, 50, iter([batch] * 8), contextlib.nullcontext, 1e-3, 1, 2, nsp)
        assert set(timing["steps_per_s"]) == {"bertkit", "transformers"} and timing["ratio"] > 0


@pytest.mark.parametrize("reading", [(), ("--max-seq-length", "32", "--full-length-share", "0.5")],
                         ids=["short-recipe", "full-length-steps"])
def test_the_context_gain_script_scores_a_model_as_its_run_did(tmp_path, monkeypatch, capsys, toy_pretraining_data,
                                                                reading):
    """scripts/context_gain.py: the held-out split, reading and baseline sample of the run the model is in (its
    pretrain_settings.json, given to `pretrain.run_datasets`), so a finished run's final model scores exactly what
    its record says, full-length steps too; a row is appended with --results."""
    data, tok = toy_pretraining_data["data"], toy_pretraining_data["tok"]
    assert bertkit_main(["pretrain", "--data", str(data), "--tokenizer", str(tok),
                         "--model", "bert-debug", "--output", str(tmp_path / "run"), "--max-steps", "3", "--seed",
                         "7", "--eval-examples", "8", "--device", "cpu", "--precision", "fp32", *reading]) == 0
    recorded = json.loads((tmp_path / "run" / "final" / "bertkit_pretraining.json").read_text())["last_eval"]
    script = load_script("context_gain")
    results = tmp_path / "rows.jsonl"
    monkeypatch.setattr(sys, "argv", ["context_gain.py", "--data", str(data), "--model",
                                      str(tmp_path / "run" / "final"), "--results", str(results)])  # the run's seed
    script.main()
    row = json.loads(results.read_text(encoding="utf-8"))
    for key in ("mlm_loss", "mlm_accuracy", "mlm_context_gain"):
        assert row[key] == pytest.approx(recorded[key], rel=1e-5), key
    held_out = min(8, len(PretrainingDataset(data)) // 10)  # at most a tenth, as the run held out
    assert row["held_out"] == held_out and (row["seed"], row["eval_examples"]) == (7, 8)
    assert "(the run's pretrain_settings.json: seed 7" in capsys.readouterr().out


def test_model_surgery_redraws_only_the_named_parts(tmp_path, monkeypatch, capsys):
    """scripts/model_surgery.py fresh: the named parts re-drawn with BERT's initialisation (LayerNorm 1 and 0,
    biases 0), every other tensor exactly as saved, the result loadable; an unknown part, or an encoder layer the
    model lacks (which would re-draw the pooler alone), stops before anything is written; geometry prints one line
    per frequency band, cosines near 0 for random embeddings."""
    from safetensors.torch import load_file  # noqa: PLC0415

    from bertkit.config import preset  # noqa: PLC0415
    from bertkit.model import BertForPreTraining  # noqa: PLC0415

    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(60)]
    model_dir = tmp_path / "model"
    BertForPreTraining(preset("bert-debug", vocab_size=len(pieces))).save_pretrained(model_dir)
    (model_dir / "vocab.txt").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}), encoding="utf-8")
    surgery = load_script("model_surgery")
    before = load_file(model_dir / "model.safetensors")
    for parts, changed in (("word_embeddings", {"bert.embeddings.word_embeddings.weight"}),
                           ("layers:1", {key for key in before if ".layer.1." in key or ".pooler." in key})):
        out = tmp_path / parts.replace(":", "")
        monkeypatch.setattr(sys, "argv", ["model_surgery.py", "fresh", "--model", str(model_dir), "--output", str(out),
                                          "--parts", parts])
        surgery.main()
        after = load_file(out / "model.safetensors")
        drawn = {key for key in changed if "LayerNorm" not in key and not key.endswith("bias")}
        assert {key for key in before if not torch.equal(before[key], after[key])} == drawn  # a new init is 1/0 too
        for key in changed:
            if "LayerNorm.weight" in key:
                assert torch.equal(after[key], torch.ones_like(after[key]))
            elif key.endswith("bias"):
                assert not after[key].any()
            else:
                assert 0.01 < after[key].std().item() < 0.03
        BertForPreTraining.from_pretrained(out)
    monkeypatch.setattr(sys, "argv", ["model_surgery.py", "fresh", "--model", str(model_dir), "--output",
                                      str(tmp_path / "none"), "--parts", "layers:2"])  # bert-debug has 2 layers
    with pytest.raises(SystemExit, match="layers:2: the model has encoder layers 0-1"):
        surgery.main()
    monkeypatch.setattr(sys, "argv", ["model_surgery.py", "fresh", "--model", str(model_dir), "--output",
                                      str(tmp_path / "none"), "--parts", "attention"])
    with pytest.raises(SystemExit, match="attention: not a part"):
        surgery.main()
    monkeypatch.setattr(sys, "argv", ["model_surgery.py", "fresh", "--model", str(model_dir), "--output",
                                      str(model_dir), "--parts", "pooler"])  # onto itself: refused, untouched
    with pytest.raises(SystemExit, match="exists; give a new directory"):
        surgery.main()
    assert torch.equal(load_file(model_dir / "model.safetensors")["bert.pooler.dense.weight"],
                       before["bert.pooler.dense.weight"])
    assert not (tmp_path / "none").exists()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(f"w{(i * j) % 60}" for j in range(10)) for i in range(50)), encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["model_surgery.py", "geometry", "--model", str(model_dir), "--corpus",
                                      str(corpus)])
    capsys.readouterr()
    surgery.main()
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokens 0-65 by frequency")  # 65 pieces: one band
    assert abs(float(lines[0].rsplit(" ", 1)[1])) < 0.1


def test_model_surgery_tiles_the_untrained_positions(tmp_path, monkeypatch):
    """scripts/model_surgery.py tile-positions: position p >= T takes position p mod T's embedding (T from the
    record's trained_positions, or --trained), every other tensor exactly as saved, the result loadable; a model
    without the record and no --trained, or T outside the table, stops with one line before anything is written;
    a write interrupted by Ctrl-C leaves nothing under the output's name (no untouched copy to mistake for it)."""
    from safetensors.torch import load_file  # noqa: PLC0415

    from bertkit.config import preset  # noqa: PLC0415
    from bertkit.model import BertForPreTraining  # noqa: PLC0415

    model_dir = tmp_path / "model"
    BertForPreTraining(preset("bert-debug", vocab_size=40)).save_pretrained(model_dir)
    surgery = load_script("model_surgery")
    key = "bert.embeddings.position_embeddings.weight"
    before = load_file(model_dir / "model.safetensors")
    monkeypatch.setattr(sys, "argv", ["model_surgery.py", "tile-positions", "--model", str(model_dir), "--output",
                                      str(tmp_path / "none")])
    with pytest.raises(SystemExit, match="no trained_positions in its bertkit_pretraining.json; give --trained T"):
        surgery.main()
    (model_dir / "bertkit_pretraining.json").write_text(json.dumps({"trained_positions": 8}), encoding="utf-8")
    for extra, trained, out in (([], 8, tmp_path / "record"), (["--trained", "5"], 5, tmp_path / "flag")):
        monkeypatch.setattr(sys, "argv", ["model_surgery.py", "tile-positions", "--model", str(model_dir),
                                          "--output", str(out), *extra])
        surgery.main()
        after = load_file(out / "model.safetensors")
        table, rows = before[key], len(before[key])
        assert torch.equal(after[key][:trained], table[:trained])
        assert all(torch.equal(after[key][p], table[p % trained]) for p in range(rows))
        assert {name for name in before if not torch.equal(before[name], after[name])} == {key}
        BertForPreTraining.from_pretrained(out)
    monkeypatch.setattr(sys, "argv", ["model_surgery.py", "tile-positions", "--model", str(model_dir), "--output",
                                      str(tmp_path / "none"), "--trained", str(len(before[key]))])
    with pytest.raises(SystemExit, match="give T in 1-"):
        surgery.main()
    assert not (tmp_path / "none").exists()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(surgery, "save_file", interrupted)  # Ctrl-C while the weights are written
    monkeypatch.setattr(sys, "argv", ["model_surgery.py", "tile-positions", "--model", str(model_dir), "--output",
                                      str(tmp_path / "none")])
    with pytest.raises(KeyboardInterrupt):
        surgery.main()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["flag", "model", "record"]  # no copy left behind


def test_cooccurrence_start_is_ppmi_svd_of_the_sampled_words(tmp_path, monkeypatch, capsys, toy_pretraining_data):
    """scripts/cooccurrence_init.py: the vectors are the rank-k PPMI-SVD of the sampled instances' words (checked
    against a dense reference by their Gram matrix, which the components' signs do not change), words used alike
    start alike, special pieces are left out, the scale at most BERT's init, a sample too small or a model too
    wide is a one-line error; as a `pretrain` wrapper it starts a fresh run's word embeddings and says so."""
    script = load_script("cooccurrence_init")
    groups = ([10, 11, 12, 13], [20, 21, 22, 23])
    rng = random.Random(0)
    items = []
    for i in range(60):
        words = [2, *(rng.choice(groups[i % 2]) for _ in range(14)), 3]  # [CLS] ... [SEP]
        ids = torch.tensor([*words, 0, 0])
        items.append({"input_ids": ids, "mlm_labels": torch.full_like(ids, -100),
                      "attention_mask": (ids != 0).long()})
    vectors, ids = script.cooccurrence_vectors(items, 30, (0, 1, 2, 3, 4), seed=0, dim=4)
    assert ids.tolist() == groups[0] + groups[1]
    assert 0.01 < vectors.std().item() <= 0.02  # centred after scaling by the uncentred spread (the screen's)
    counts = np.zeros((30, 30))
    for item in items:
        words = [w for w in item["input_ids"].tolist() if w > 4]
        for distance in range(1, script.WINDOW + 1):
            for a, b in zip(words, words[distance:], strict=False):
                counts[a, b] += 1
                counts[b, a] += 1
    context = counts.sum(0) ** script.CONTEXT_SMOOTHING
    with np.errstate(divide="ignore", invalid="ignore"):
        pmi = np.log(counts / counts.sum() / np.outer(counts.sum(1) / counts.sum(), context / context.sum()))
    ppmi = np.where(np.isfinite(pmi) & (pmi > 0), pmi, 0.0)
    u, s, _ = np.linalg.svd(ppmi)
    reference = (u[:, :4] * np.sqrt(s[:4]))[ids.numpy()]
    reference = (reference - reference.mean(0)) / reference.std() * 0.02
    assert np.allclose(vectors.numpy() @ vectors.numpy().T, reference @ reference.T, atol=1e-6)
    similar = torch.nn.functional.cosine_similarity(vectors[:, None], vectors[None], dim=-1)
    assert similar[:4, :4].mean() > similar[:4, 4:].mean() + 0.5
    with pytest.raises(SystemExit, match="no 30-dimensional SVD"):
        script.cooccurrence_vectors(items, 30, (0, 1, 2, 3, 4), seed=0, dim=30)
    lone = [{**item, "attention_mask": (item["input_ids"] == 2).long()} for item in items]  # [CLS] alone
    with pytest.raises(SystemExit, match="no two words side by side"):
        script.cooccurrence_vectors(lone, 30, (0, 1, 2, 3, 4), seed=0, dim=4)

    monkeypatch.setattr(script.pretrain, "_unigram_start", script._start_with_cooccurrence)
    data, tok = toy_pretraining_data["data"], toy_pretraining_data["tok"]
    assert bertkit_main(["pretrain", "--data", str(data), "--tokenizer", str(tok), "--model", "bert-debug",
                         "--output", str(tmp_path / "run"), "--max-steps", "1", "--device", "cpu"]) == 0
    assert "pieces started from co-occurrence (PPMI-SVD)" in capsys.readouterr().err


class _FixedGenerator(torch.nn.Module):
    """A generator whose prediction at each selected position is `picks` (near-certain logits), trainable."""

    def __init__(self, picks: list[int], vocab_size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.nn.functional.one_hot(torch.tensor(picks), vocab_size).float() * 60)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, masked_positions=None):
        assert int(masked_positions.sum()) == len(self.weight)
        return SimpleNamespace(logits=self.weight)


def test_replaced_token_detection_labels_what_the_generator_changed(toy_pretraining_data):
    """scripts/electra_pretrain.py: the loss is the generator's mean MLM over the selected tokens plus 50 times the
    discriminator's mean binary cross-entropy over the real tokens; the discriminator reads the original text with
    the generator's samples in the selected places, and a token counts as replaced only where the sample differs
    from the original (a sample equal to it is not); padding is not read as a token."""
    script = load_script("electra_pretrain")
    config = load_config("bert-debug").replace(vocab_size=40, hidden_dropout_prob=0.0,
                                                attention_probs_dropout_prob=0.0)
    assert script.generator_config(config).hidden_size == 32  # a quarter, at least 64, never wider than the model
    assert script.generator_config(config.replace(hidden_size=512, num_attention_heads=8)).hidden_size == 128
    torch.manual_seed(0)
    model = BertForMaskedLM(config)
    model.electra_generator = _FixedGenerator([8, 11], 40)  # the [MASK] at 2 sampled back as 8, the 9 at 3 as 11
    model.electra_head = script.ReplacedTokenHead(config.hidden_size, 0.02)
    batch = {"input_ids": torch.tensor([[2, 7, 4, 9, 3, 0]]), "token_type_ids": torch.zeros(1, 6, dtype=torch.long),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0]]),
             "mlm_labels": torch.tensor([[-100, -100, 8, 9, -100, -100]])}
    objective = script.ReplacedTokenObjective()
    totals = objective.counts(batch)
    assert totals == {"mlm": 2, "rtd": 5}
    loss, metrics = objective(model, batch, totals)
    corrupted = torch.tensor([[2, 7, 8, 11, 3, 0]])
    logits = model.electra_head(model.bert(corrupted, batch["token_type_ids"], batch["attention_mask"])
                                .last_hidden_state)[0, :5]
    rtd = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([0.0, 0, 0, 1, 0]))
    mlm = torch.nn.functional.cross_entropy(model.electra_generator.weight, torch.tensor([8, 9]))
    assert torch.allclose(loss, mlm + 50 * rtd, atol=1e-5)
    assert float(metrics["replaced"]) == pytest.approx(1 / 5) and float(metrics["mlm_accuracy"]) == 0.5
    loss.backward()
    assert model.electra_generator.weight.grad is not None and model.bert.embeddings.word.weight.grad is not None
    with pytest.raises(SystemExit, match="per-batch-shape step only"):
        objective.counts({"masked_lm_positions": torch.zeros(1, 2)})


def _whole_and_resumed_runs(script, tmp_path: Path, monkeypatch, toy_pretraining_data):
    """A wrapper script's runs on the toy data: plain/ (bertkit's own masked LM, 2 steps, before the script's
    patches), whole/ (the script's, 4 steps, a checkpoint every 2) and halves/ (whole/ as if stopped after its step-2
    checkpoint, then resumed to 4). Returns `run(output, steps, *flags)` for more; the patches stay on."""
    data, tok = toy_pretraining_data["data"], toy_pretraining_data["tok"]

    def run(output: Path, steps: int, *extra: str) -> int:
        return bertkit_main(["pretrain", "--data", str(data), "--tokenizer", str(tok), "--model", "bert-debug",
                             "--output", str(output), "--max-steps", str(steps), "--save-every", "2",
                             "--eval-every", "2", "--device", "cpu", "--seed", "3", *extra])

    assert run(tmp_path / "plain", 2) == 0
    for name, patched in script.PATCHES.items():
        monkeypatch.setattr(script.pretrain, name, patched)
    assert run(tmp_path / "whole", 4) == 0
    shutil.copytree(tmp_path / "whole", tmp_path / "halves")
    shutil.rmtree(tmp_path / "halves" / "checkpoints" / "step-00000004")
    shutil.rmtree(tmp_path / "halves" / "final")
    assert run(tmp_path / "halves", 4, "--resume", "auto") == 0
    return run


def test_replaced_token_detection_run_resumes_exactly_and_keeps_the_discriminator(tmp_path, monkeypatch, capsys,
                                                                                  toy_pretraining_data):
    """As a `pretrain` wrapper: every saved directory keeps the generator and the head (electra.pt), a run resumed
    from a checkpoint ends with the weights of the run that never stopped, final/'s weights are the discriminator
    alone, which transformers loads with nothing left over; a plain run's checkpoint is not resumed by the script nor
    the script's by a plain run (the model differs), and --init-from is refused in one line."""
    from transformers import BertForMaskedLM as HFBertForMaskedLM  # noqa: PLC0415

    script = load_script("electra_pretrain")
    run = _whole_and_resumed_runs(script, tmp_path, monkeypatch, toy_pretraining_data)
    assert (tmp_path / "whole" / "checkpoints" / "step-00000002" / script.EXTRA_FILE).is_file()
    whole = read_state_dict(tmp_path / "whole" / "final")
    halves = read_state_dict(tmp_path / "halves" / "final")
    assert whole.keys() == halves.keys() and not any("electra" in key for key in whole)
    assert all(torch.equal(whole[key], halves[key]) for key in whole)
    extras = [torch.load(tmp_path / run_dir / "final" / script.EXTRA_FILE) for run_dir in ("whole", "halves")]
    assert all(torch.equal(value, extras[1]["electra_generator"][key])
               for key, value in extras[0]["electra_generator"].items())
    HFBertForMaskedLM.from_pretrained(tmp_path / "whole" / "final")
    capsys.readouterr()
    assert run(tmp_path / "plain", 4, "--resume", "auto") != 0
    assert "replaced-token detection" in capsys.readouterr().err
    monkeypatch.undo()
    assert run(tmp_path / "whole", 6, "--resume", "auto") != 0
    assert "replaced-token detection" in capsys.readouterr().err
    for name, patched in script.PATCHES.items():
        monkeypatch.setattr(script.pretrain, name, patched)
    with pytest.raises(SystemExit, match="a fresh masked-LM-only model only"):
        run(tmp_path / "continued", 2, "--init-from", str(tmp_path / "whole" / "final"))


def test_the_untied_decoder_scores_words_against_its_own_matrix():
    """scripts/untied_decoder_pretrain.py: the masked-LM logits are the head's transform against the decoder's own
    matrix plus the head's bias, and a word embedding gets gradient only where its word is in the input (tied, every
    row would)."""
    script = load_script("untied_decoder_pretrain")
    config = load_config("bert-debug").replace(vocab_size=40, hidden_dropout_prob=0.0,
                                                attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForMaskedLM(config)
    script.untie(model)
    assert model.untied_decoder.weight.shape == model.bert.embeddings.word.weight.shape
    assert not torch.equal(model.untied_decoder.weight, model.bert.embeddings.word.weight)
    input_ids = torch.tensor([[2, 7, 4, 9, 3]])
    selected = torch.tensor([[False, False, True, True, False]])
    logits = model(input_ids, masked_positions=selected).logits
    hidden = model.bert(input_ids).last_hidden_state[selected]
    head = model.mlm
    expected = torch.nn.functional.linear(head.norm(head.act(head.transform(hidden))), model.untied_decoder.weight,
                                          head.bias)
    assert torch.allclose(logits, expected, atol=1e-6)
    logits.logsumexp(-1).sum().backward()
    word_grad = model.bert.embeddings.word.weight.grad
    absent = [i for i in range(40) if i not in (2, 7, 4, 9, 3)]
    assert torch.count_nonzero(word_grad[absent]) == 0 and torch.count_nonzero(word_grad[[2, 7, 4, 9, 3]]) > 0
    assert torch.count_nonzero(model.untied_decoder.weight.grad[absent]) > 0


def test_the_untied_decoder_run_resumes_exactly_and_keeps_a_plain_model(tmp_path, monkeypatch, capsys, caplog,
                                                                         toy_pretraining_data):
    """As a `pretrain` wrapper: every saved directory keeps the decoder (untied_decoder.pt), a run resumed from a
    checkpoint ends with the weights of the run that never stopped, decoder included, final/ is a BertForMaskedLM
    directory transformers loads with nothing left over; neither a plain run nor the script resumes the other's run;
    a checkpoint that lost its decoder is passed over by --resume auto (bertkit's record of each checkpoint's files),
    and loading one anyway is a one-line error; --init-from is refused in one line."""
    from transformers import BertForMaskedLM as HFBertForMaskedLM  # noqa: PLC0415

    script = load_script("untied_decoder_pretrain")
    run = _whole_and_resumed_runs(script, tmp_path, monkeypatch, toy_pretraining_data)
    assert (tmp_path / "whole" / "checkpoints" / "step-00000002" / script.EXTRA_FILE).is_file()
    whole = read_state_dict(tmp_path / "whole" / "final")
    halves = read_state_dict(tmp_path / "halves" / "final")
    assert whole.keys() == halves.keys() and not any("untied" in key for key in whole)
    assert all(torch.equal(whole[key], halves[key]) for key in whole)
    decoders = [torch.load(tmp_path / run_dir / "final" / script.EXTRA_FILE) for run_dir in ("whole", "halves")]
    decoders = [saved["untied_decoder"]["weight"] for saved in decoders]
    assert torch.equal(decoders[0], decoders[1])
    assert not torch.equal(decoders[0], whole["bert.embeddings.word_embeddings.weight"])
    HFBertForMaskedLM.from_pretrained(tmp_path / "whole" / "final")
    capsys.readouterr()
    assert run(tmp_path / "plain", 4, "--resume", "auto") != 0
    assert "untied masked-LM decoder" in capsys.readouterr().err
    (tmp_path / "halves" / "checkpoints" / "step-00000004" / script.EXTRA_FILE).unlink()
    with caplog.at_level("WARNING"):
        assert run(tmp_path / "halves", 6, "--resume", "auto") == 0  # from step 2: the files checkpoint-wise
    assert "step-00000004: untied_decoder.pt is missing" in caplog.text
    untied = BertForMaskedLM.from_pretrained(tmp_path / "plain" / "final")
    script.untie(untied)
    with pytest.raises(SystemExit, match="has no untied_decoder.pt"):
        untied.load_hf_state_dict(read_state_dict(tmp_path / "plain" / "final"), source=str(tmp_path))
    monkeypatch.undo()
    assert run(tmp_path / "whole", 6, "--resume", "auto") != 0
    assert "untied masked-LM decoder" in capsys.readouterr().err
    for name, patched in script.PATCHES.items():
        monkeypatch.setattr(script.pretrain, name, patched)
    with pytest.raises(SystemExit, match="a fresh single-process masked-LM-only model only"):
        run(tmp_path / "continued", 2, "--init-from", str(tmp_path / "whole" / "final"))


def test_document_contrast_views_read_only_their_own_segment():
    """scripts/document_contrast_pretrain.py: with the block mask, segment A's states do not change when B's tokens
    do (and B's not when A's do), so the two mean-pooled views are separate readings of the row; padding changes
    neither."""
    script = load_script("document_contrast_pretrain")
    config = load_config("bert-debug").replace(vocab_size=40, hidden_dropout_prob=0.0,
                                                attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForMaskedLM(config).eval()
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 0]])
    batch = {"input_ids": torch.tensor([[2, 7, 8, 3, 9, 10, 3, 0]]), "token_type_ids": types,
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]])}
    states, in_b = script.segment_views(model, batch)
    assert in_b.tolist() == [[False, False, False, False, True, True, True, False]]
    other_b = dict(batch, input_ids=torch.tensor([[2, 7, 8, 3, 20, 21, 3, 0]]))
    other_a = dict(batch, input_ids=torch.tensor([[2, 30, 31, 3, 9, 10, 3, 0]]))
    unpadded = {key: value[:, :7] for key, value in batch.items()}
    assert torch.allclose(script.segment_views(model, other_b)[0][0, :4], states[0, :4], atol=1e-6)
    assert not torch.allclose(script.segment_views(model, other_b)[0][0, 4:7], states[0, 4:7], atol=1e-3)
    assert torch.allclose(script.segment_views(model, other_a)[0][0, 4:7], states[0, 4:7], atol=1e-6)
    assert torch.allclose(script.segment_views(model, unpadded)[0][0], states[0, :7], atol=1e-6)


def test_document_contrast_loss_is_infonce_over_the_positive_rows():
    """InfoNCE against the batch's other views, both directions, averaged over the rows whose B follows A: near 0
    when each row's two views match and differ from the rest, log(B) when all views are alike, and a zero that
    still reaches the views when no row is positive."""
    script = load_script("document_contrast_pretrain")
    views = torch.eye(4)
    everyone = torch.ones(4, dtype=torch.bool)
    assert float(script.info_nce(views, views, everyone)) < 1e-6
    alike = torch.ones(4, 3)
    assert float(script.info_nce(alike, alike, everyone)) == pytest.approx(float(np.log(4)), abs=1e-5)
    scores = torch.nn.functional.normalize(torch.randn(4, 3), dim=-1)
    other = torch.nn.functional.normalize(torch.randn(4, 3), dim=-1)
    rows = torch.tensor([True, False, True, False])
    logits = scores @ other.T / script.TEMPERATURE
    expected = sum(float(torch.logsumexp(logits[i], 0) - logits[i, i]) + float(torch.logsumexp(logits[:, i], 0)
                                                                               - logits[i, i]) for i in (0, 2)) / 4
    assert float(script.info_nce(scores, other, rows)) == pytest.approx(expected, rel=1e-5)
    leaf = torch.randn(4, 3, requires_grad=True)
    none = script.info_nce(leaf, leaf, torch.zeros(4, dtype=torch.bool))
    none.backward()
    assert float(none.detach()) == 0.0 and leaf.grad is not None


def test_document_contrast_run_resumes_exactly_and_is_not_resumed_by_a_plain_run(tmp_path, monkeypatch, capsys,
                                                                                 toy_pretraining_data):
    """As a `pretrain` wrapper: the training log carries the contrast loss, a run resumed from a checkpoint ends with
    the weights of the run that never stopped, and a plain run does not resume the script's (the objective is in
    the run's identity)."""
    script = load_script("document_contrast_pretrain")
    run = _whole_and_resumed_runs(script, tmp_path, monkeypatch, toy_pretraining_data)
    whole = read_state_dict(tmp_path / "whole" / "final")
    halves = read_state_dict(tmp_path / "halves" / "final")
    assert all(torch.equal(whole[key], halves[key]) for key in whole)
    rows = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert any("contrast_loss" in row for row in rows if row.get("kind") == "train")
    state = json.loads((tmp_path / "whole" / "checkpoints" / "step-00000004" / "trainer_state.json").read_text())
    assert state["context"]["kernels"]["last_layer"] == "full (segment views)"  # not the recipe's masked positions
    monkeypatch.undo()
    capsys.readouterr()
    assert run(tmp_path / "whole", 6, "--resume", "auto") != 0
    assert "same-document contrast" in capsys.readouterr().err


def test_document_contrast_weight_is_taken_off_the_pretrain_arguments():
    """--contrast-weight is the script's own; everything else goes to `bertkit pretrain`; a weight < 0 is refused."""
    script = load_script("document_contrast_pretrain")
    assert script.split_weight(["--data", "d", "--contrast-weight", "0.1", "--seed", "2"]) == (0.1, ["--data", "d",
                                                                                                 "--seed", "2"])
    assert script.split_weight(["--data", "d"]) == (script.WEIGHT, ["--data", "d"])
    assert script.split_weight(["--contrast-weight", "0"])[0] == 0.0  # the control: the block mask alone
    with pytest.raises(SystemExit, match="--contrast-weight must be >= 0"):
        script.split_weight(["--contrast-weight", "-1"])


def test_document_contrast_objective_adds_the_weighted_contrast_to_masked_lm(monkeypatch):
    """The step's loss is the masked-LM cross-entropy over the step's masked tokens (read under the block mask)
    plus `weight` x the InfoNCE of the rows whose B follows A; a step split over micro-batches is refused."""
    script = load_script("document_contrast_pretrain")
    config = load_config("bert-debug").replace(vocab_size=40, hidden_dropout_prob=0.0,
                                                attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForMaskedLM(config)
    batch = {"input_ids": torch.tensor([[2, 7, 4, 3, 9, 10, 3], [2, 11, 12, 3, 4, 14, 3]]),
             "token_type_ids": torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]]),
             "attention_mask": torch.ones(2, 7, dtype=torch.int64),
             "mlm_labels": torch.tensor([[-100, -100, 8, -100, -100, 13, -100], [-100, 5, -100, -100, 13, -100, -100]]),
             "nsp_labels": torch.tensor([0, 1])}
    objective = script.DocumentContrastObjective(nsp=False)
    totals = {"mlm": torch.tensor(4)}
    monkeypatch.setattr(script, "weight", 0.5)
    loss, metrics = objective(model, batch, totals)
    states, in_b = script.segment_views(model, batch)
    masked = batch["mlm_labels"] != -100
    logits = model.mlm(states[masked], model.bert.embeddings.word.weight)
    mlm = torch.nn.functional.cross_entropy(logits, batch["mlm_labels"][masked], reduction="sum") / 4
    in_a = (batch["token_type_ids"] == 0)
    views = [(states * part[..., None]).sum(1) / part.sum(1, keepdim=True) for part in (in_a, in_b)]
    contrast = script.info_nce(*views, torch.tensor([True, False]))
    assert float(loss.detach()) == pytest.approx(float((mlm + 0.5 * contrast).detach()), rel=1e-5)
    assert float(metrics["contrast_loss"]) == pytest.approx(float(contrast.detach()), rel=1e-5)
    assert float(contrast.detach()) > 0
    with pytest.raises(SystemExit, match="one micro-batch a step"):
        objective(model, batch, {"mlm": torch.tensor(8)})


def test_bag_of_words_readings_print_each_reading_with_c_chosen_on_dev(tmp_path, capsys):
    """scripts/bag_of_words_readings.py: on a task whose label is the document a text comes from, the document
    reading (a classifier of the corpus's documents, read by the labels) scores high; each line names the C dev
    chose from the grid."""
    script = load_script("bag_of_words_readings")
    rng = random.Random(0)
    topics = {label: [f"{label}word{i}" for i in range(12)] for label in ("a", "b", "c")}
    common = [f"common{i}" for i in range(30)]

    def text(label: str) -> str:
        return " ".join(rng.choice(topics[label]) if rng.random() < 0.3 else rng.choice(common) for _ in range(40))

    task = tmp_path / "task"
    task.mkdir()
    for split, count in (("train", 60), ("dev", 30), ("test", 30)):
        rows = [{"text": text(label), "label": label} for label in ("a", "b", "c") for _ in range(count // 3)]
        (task / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    documents = ["\n".join(text(label) for _ in range(30)) for label in ("a", "b", "c") for _ in range(2)]
    (task / "corpus.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    script.main(["--task", str(task), "--train-sizes", "30,60", "--topics", "5"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["tfidf", "tfidf", "topics", "document"]
    assert lines[0].startswith("tfidf N=30 C=") and "documents=6" in lines[3]
    assert all(line.split("C=")[1].split()[0] in ("1", "10", "100") for line in lines)
    assert float(lines[3].split("test ")[1]) > 80
