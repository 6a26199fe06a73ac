"""The route table (bertkit.serve.routes.ROUTES) is the one declaration of a route: a toy route added as one
entry is served, batched under its call, described in the OpenAPI, listed by /info and the 404 body, and counted
by the metrics; every list the server gives of its routes equals the table's for each kind of model."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import Depends
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from bertkit.serve.app import create_app
from bertkit.serve.compat import RequestBody
from bertkit.serve.predictor import load_predictor
from bertkit.serve.routes import ROUTES, served_paths
from bertkit.serve.routing import Call, Route, Server, serving

# --- a toy route: its handler and its one table entry -----------------------------------------------------


class ShoutRequest(RequestBody):
    inputs: list[str]


async def shout(body: ShoutRequest, server: Server = Depends(serving)) -> dict[str, Any]:
    return {"results": await server.submit((), body.inputs)}


SHOUT = Route("/shout", shout, "Texts in capitals, a batch at a time.", counted=True,
              call=Call("shout", lambda predictor, options, items: [f"{t.upper()} ({len(items)})" for t in items]))


def _metrics(client: TestClient) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(client.get("/metrics").text) for s in family.samples}


def test_a_route_is_one_table_entry(mlm_dir):
    predictor = load_predictor(mlm_dir)
    with TestClient(create_app(predictor, routes=(*ROUTES, SHOUT))) as client:
        answer = client.post("/shout", json={"inputs": ["the cat", "a dog"]})
        assert answer.status_code == 200 and answer.json() == {"results": ["THE CAT (2)", "A DOG (2)"]}
        assert "/shout" in client.get("/openapi.json").json()["paths"]
        assert client.get("/info").json()["endpoints"] == [*served_paths(predictor)[:-1], "/shout", "/docs"]
        assert "/shout" in client.post("/nowhere", json={}).json()["endpoints"]
        samples = _metrics(client)
    assert samples[("bertkit_batch_inputs_sum", frozenset({("call", "shout")}))] == 2
    assert samples[("te_request_count_total", frozenset({("method", "batch")}))] == 1  # counted: a model route


def test_a_route_the_model_cannot_serve_is_not_there(mlm_dir):
    tagging_only = Route("/shout", shout, "Needs a tagger.", call=SHOUT.call, needs="tag")
    with TestClient(create_app(load_predictor(mlm_dir), routes=(*ROUTES, tagging_only))) as client:
        refused = client.post("/shout", json={"inputs": ["the cat"]})
        assert refused.status_code == 404 and "/shout" not in refused.json()["endpoints"]
        assert "/shout" not in client.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize("fixture", ["mlm_dir", "classifier_dir", "regression_dir", "tagger_dir", "squad_dir",
                                     "bert_dir"])
def test_every_list_of_routes_is_the_tables(fixture, request):
    predictor = load_predictor(request.getfixturevalue(fixture))
    listed = served_paths(predictor)
    with TestClient(create_app(predictor)) as client:
        assert client.get("/info").json()["endpoints"] == listed
        assert client.post("/no/such/path", json={}).json()["endpoints"] == listed
        assert set(client.get("/openapi.json").json()["paths"]) == set(listed) - {"/docs"}
    assert {f"/{endpoint}" for endpoint in predictor.endpoints} <= set(listed)  # each thing the model does
