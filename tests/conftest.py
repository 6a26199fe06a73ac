"""Fixed hardware measurements for the whole test suite.

Design decision: `--precision auto` and the CPU kernel choices come from a probe that times this
machine (bertkit.runtime.probe). Under tests they read BERTKIT_PROBE_FILE instead, set here before any test
runs and inherited by the commands tests start in subprocesses, so every test is fast and gets the same
choices on any machine: those of the 2-core AMD EPYC the kernels were tuned on
(tests/assets/probe/amd-epyc.json). The probe cache goes to a temporary directory, never the user's.
tests/runtime/test_probe.py runs the real probe once.

TRITON_INTERPRET=1 is set here too, without a GPU, so the Triton kernels' tests (tests/kernels) run under
Triton's interpreter whatever other test imported Triton first.

Also the fixtures several directories share: `use_profile` (another machine's measurements for one
test), `write_toy_corpus` (a small seeded corpus of documents for pre-training runs) and `toy_pretraining_data`
(that corpus's vocabulary and 64-token pre-training data, built once a session).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # bertkit.kernels' Triton kernels run under Triton's CPU interpreter without a GPU; Triton reads this once, when
    # something first imports it (torch.compile does), so it is set before any test module is collected.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from bertkit.runtime import probe

PROFILES = Path(__file__).parent / "assets" / "probe"
PROBE_FILE = PROFILES / "amd-epyc.json"
_cache_dir: str | None = None


def pytest_configure(config) -> None:
    global _cache_dir
    _cache_dir = tempfile.mkdtemp(prefix="bertkit-test-cache-")
    os.environ["BERTKIT_PROBE_FILE"] = str(PROBE_FILE)
    os.environ["BERTKIT_CACHE_DIR"] = _cache_dir


def pytest_unconfigure(config) -> None:
    if _cache_dir is not None:
        shutil.rmtree(_cache_dir, ignore_errors=True)


@pytest.fixture
def use_profile(monkeypatch):
    """`use_profile("intel-xeon-no-amx")` points BERTKIT_PROBE_FILE at that profile for this test (the
    suite's default is amd-epyc)."""
    def use(name: str) -> None:
        monkeypatch.setenv("BERTKIT_PROBE_FILE", str(PROFILES / f"{name}.json"))
        probe.reset()
    yield use
    monkeypatch.undo()
    probe.reset()


TOY_WORDS = ("the river ran past old stone mills where the miller kept his grain and his accounts in a small "
             "book that nobody else could read because he wrote in a hand of his own making").split()


def _write_toy_corpus(path: Path, documents: int, sentences: tuple[int, int], words: tuple[int, int]) -> Path:
    """`documents` documents of `sentences` (min, max) sentences of `words` (min, max) words, one sentence
    per line and a blank line after each document; the same file for the same arguments."""
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(documents):
            for _ in range(rng.randint(*sentences)):
                f.write(" ".join(rng.choice(TOY_WORDS) for _ in range(rng.randint(*words))).capitalize() + ".\n")
            f.write("\n")
    return path


@pytest.fixture(scope="session")
def write_toy_corpus() -> Callable[..., Path]:
    return _write_toy_corpus


@pytest.fixture(scope="session")
def toy_pretraining_data(tmp_path_factory) -> dict[str, Path]:
    """{"tok", "data"}: a 120-piece vocabulary and 64-token dynamically masked pre-training data of a 20-document toy
    corpus, built once and only read (runs write their own output elsewhere)."""
    from bertkit.data import InstanceSettings, PretrainingDataSettings, build_pretraining_data  # noqa: PLC0415
    from bertkit.tokenizer import WordPieceTokenizer  # noqa: PLC0415

    root = tmp_path_factory.mktemp("toy-pretraining")
    corpus = _write_toy_corpus(root / "corpus.txt", documents=20, sentences=(3, 6), words=(6, 14))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=120, min_frequency=1)
    tokenizer.save_pretrained(root / "tok")
    build_pretraining_data(PretrainingDataSettings((str(corpus),), "(in memory)", str(root / "data"), workers=1,
                                                   quiet=True, instances=InstanceSettings(max_seq_length=64)),
                           tokenizer)
    return {"tok": root / "tok", "data": root / "data"}
