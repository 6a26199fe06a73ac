"""Batches by tokens: the micro-batcher's budget, the batches the runner receives, and the token counts.

The batcher is driven directly with a recording runner whose items are their own token counts, and once
through the app, where the runner is the predictor; the counts of bertkit.serve.cost are checked against
the features the predictors build.
"""

from __future__ import annotations

import asyncio
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bertkit.cli import main
from bertkit.data.squad import SquadExample
from bertkit.errors import BertkitError
from bertkit.serve.app import create_app
from bertkit.serve.cost import token_cost
from bertkit.serve.microbatch import MicroBatcher
from bertkit.serve.predictor import load_predictor
from bertkit.serve.routes import CALLS
from bertkit.settings import ServerSettings


def _batch(requests: list[list[int]], budget: int, max_batch_size: int = 8, fail: int | None = None,
           ) -> tuple[list, list[list[int]]]:
    """Submit every request at once to a batcher whose items cost their own value; each request's
    results (or exception) and the batches the runner received."""
    batches: list[list[int]] = []

    def run(key, items):
        batches.append(list(items))
        if fail in items:
            raise BertkitError(f"input {fail} is bad")
        return [f"r{item}" for item in items]

    async def serve() -> list:
        batcher = MicroBatcher(run, max_batch_size=max_batch_size, max_wait_s=0.05, max_batch_tokens=budget,
                               cost=lambda key, items: list(items))
        batcher.start()
        results = await asyncio.gather(*(batcher.submit(("embed",), r, 10) for r in requests),
                                       return_exceptions=True)
        await batcher.stop()
        return results

    return asyncio.run(serve()), batches


def test_batches_never_exceed_the_token_budget_and_results_keep_request_order():
    requests = [[5, 7], [90], [150], [30, 30, 30], [1] * 12, [60, 50, 40, 30], [100], [2, 99]]
    results, batches = _batch(requests, budget=100)
    assert results == [[f"r{item}" for item in request] for request in requests]
    assert sorted(item for batch in batches for item in batch) == sorted(i for r in requests for i in r)
    for batch in batches:
        assert len(batch) <= 8
        assert sum(batch) <= 100 or len(batch) == 1, batch  # only a lone input may be over the budget
    assert [150] in batches


def test_short_inputs_are_not_padded_to_a_long_ones_length():
    """A long input (60 tokens) beside ten short ones (5): with a budget of 64 it cannot share a batch,
    and the short ones run together whatever their order of arrival."""
    requests = [[5]] * 4 + [[60]] + [[5]] * 6
    _, batches = _batch(requests, budget=64, max_batch_size=32)
    assert [60] in batches
    assert all(max(batch) == 5 for batch in batches if batch != [60])
    # By count, as before (a budget nothing reaches), they share one batch padded to 60 tokens.
    _, by_count = _batch(requests, budget=10**9, max_batch_size=32)
    assert by_count == [sorted(i for r in requests for i in r)]


def test_a_bad_input_fails_its_own_request_only():
    results, _ = _batch([[3], [4, 13], [5]], budget=100, fail=13)
    assert results[0] == ["r3"] and results[2] == ["r5"]
    assert isinstance(results[1], BertkitError)


def _one(cost):
    """cost(key, item) from the per-request cost(key, items)."""
    return lambda key, item: cost(key, [item])[0]


def test_token_counts_equal_the_predictors_features(mlm_dir, classifier_dir, tagger_dir, squad_dir):
    long = "the cat sat on the mat and the dog ran in the park " * 5
    # Longer than the prefix that is counted first: many short words, then words over 100 characters
    # (one [UNK] each, so the prefix has too few tokens and the whole text is counted), no space at all.
    longer = ["the cat sat. " * 1500, ("abcdefghij" * 12 + " ") * 150, "x" * 5000]
    mlm = load_predictor(mlm_dir)
    cost = _one(token_cost(mlm, CALLS))
    for text in ["the cat", long, "", "x" * 50, *longer]:
        [feature], _ = mlm.encode([text])
        assert cost(("embed", "auto", None), text) == len(feature["input_ids"])
        assert cost(("embeddings", True, "right"), text) == len(feature["input_ids"])
        assert cost(("tokenize", True), text) == 0  # no model run
    masked = "the [MASK] sat on [MASK] mat"
    assert cost(("fill-mask", 5), masked) == len(mlm._masked_feature(masked, 0)["input_ids"])

    classifier = load_predictor(classifier_dir)
    cost = _one(token_cost(classifier, CALLS))
    for text, pair in [("the cat", None), ("the cat sat", "on the mat"), (long, long), (longer[0], "the cat"),
                       ("the cat", longer[1])]:
        [feature], _ = classifier.encode([text], None if pair is None else [pair])
        assert cost(("classify", pair is not None), (text, pair)) == len(feature["input_ids"])
        if pair is not None:
            assert cost(("rerank", True, "right", False), (text, pair)) == len(feature["input_ids"])

    tagger = load_predictor(tagger_dir)  # max_seq_length 10, doc_stride 3: long texts in windows
    cost = _one(token_cost(tagger, CALLS))
    for text in ["john smith lives in london", long]:
        sentences, _ = tagger.sentences([text])
        features = tagger.task.features(sentences, tagger.tokenizer)
        assert cost(("tag",), text) == sum(len(f["input_ids"]) for f in features)

    reader = load_predictor(squad_dir)  # max_seq_length 24, doc_stride 5, max_query_length 8
    cost = _one(token_cost(reader, CALLS))
    for question, context in [("who lives in london?", "john smith lives in london"), ("where?" * 20, long)]:
        features = reader.task.features([SquadExample("0", question, context, (), False)], reader.tokenizer)
        assert cost(("answer",), (question, context)) == sum(len(f["input_ids"]) for f in features)


def test_the_app_runs_short_requests_apart_from_a_long_one(mlm_dir):
    """Concurrent requests through the app: the predictor's calls stay within --max-batch-tokens, the long
    text runs alone, and every request gets its own result."""
    predictor = load_predictor(mlm_dir)
    calls, lock, embed = [], threading.Lock(), predictor.embed

    def recording(texts, **options):
        with lock:
            calls.append(list(texts))
        return embed(texts, **options)

    predictor.embed = recording  # type: ignore[method-assign]
    cost = _one(token_cost(predictor, CALLS))
    long, shorts = "the cat sat on the mat " * 5, [f"the {w}" for w in "cat dog mat park house city".split()]
    budget = cost(("embed",), long) + 3  # the long text (32 tokens) and one short (4) are over it
    texts = [*shorts[:3], long, *shorts[3:]]
    app = create_app(predictor, ServerSettings(max_batch_tokens=budget, max_wait_ms=100))
    with TestClient(app) as client, ThreadPoolExecutor(len(texts)) as pool:
        responses = list(pool.map(lambda t: client.post("/embed", json={"inputs": [t]}), texts))
    assert all(r.status_code == 200 for r in responses)
    for text, response in zip(texts, responses):
        np.testing.assert_allclose(response.json(), embed([text], normalize=True), atol=1e-5)
    calls = [c for c in calls if c != ["warm up"]]
    assert [long] in calls
    assert all(sum(cost(("embed",), t) for t in call) <= budget for call in calls if call != [long])
    assert sorted(t for call in calls for t in call) == sorted(texts)


def test_serve_help_lists_the_budget(capsys):
    assert main(["serve", "--help"]) == 0
    assert re.search(r"--max-batch-tokens INTEGER RANGE .*?\[default: 16384; x>=1\]",
                     " ".join(capsys.readouterr().out.split()))
    assert ServerSettings().max_batch_tokens == 16_384
    with pytest.raises(BertkitError, match="--max-batch-tokens must be >= 1"):
        ServerSettings(max_batch_tokens=0)
