"""What a route of the server is, as data: `Route` (path, method, handler, the predictor `Call` it runs under,
what the model must do for it to be served), and `Server`, what a handler receives to do its work.

A handler is a FastAPI path operation whose parameters are its request body and `server: Server =
Depends(serving)`: `serving` gives it the predictor, the settings, and `server.submit(options, items)`, which
queues the items on the micro-batcher under its route's call, key `(call.name, *options)`. So the batch key of
every request is the one its route declares, and `bertkit.serve.routes.ROUTES`, the one table of routes, is
where dispatch (the batcher's runner and token cost), the 404 list of what is served, /info's `endpoints`, the
OpenAPI description and the metrics' model routes all come from.

Design decision: the route table is plain data read by `create_app`, as text-embeddings-inference registers its
routes in one `Router` block (router/src/http/server.rs); a handler never registers itself or names its batch
key, so adding a route is one entry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from fastapi import Request

from bertkit.serve.cost import token_cost
from bertkit.serve.limits import CLIENT_CLOSED, FieldError, RequestError
from bertkit.serve.microbatch import ClientGoneError, MicroBatcher, NotRunningError, QueueFullError
from bertkit.serve.predictor import InputTooLongError, Predictor
from bertkit.settings import ServerSettings


@dataclass(frozen=True)
class Call:
    """A predictor call that queued requests are batched under (the micro-batcher's key is `(name, *options)`)."""

    name: str
    """The key's first element, and the `call` label of the batch metrics."""
    run: Callable[[Any, tuple[Any, ...], list[Any]], list[Any]]
    """`run(predictor, options, items)`: one result per item, for items queued with the same options."""
    cost: Callable[[Any, tuple[Any, ...], list[Any]], list[int]] | None = None
    """`cost(predictor, options, items)`: the tokens the model runs for each item (bertkit.serve.cost); None:
    each item as one sequence (`cost.sequence_costs`)."""
    runs_model: bool = True
    """False for a call of the tokenizer alone (/tokenize): costs no tokens, has no TEI timing."""


@dataclass(frozen=True)
class Route:
    """One path and method of the server."""

    path: str
    handler: Callable[..., Awaitable[Any]]
    """The FastAPI path operation: its parameters are the request body and `server: Server = Depends(serving)`."""
    summary: str
    """Its line in the OpenAPI description (/docs)."""
    method: str = "POST"
    call: Call | None = None
    """The predictor call its inputs are queued under (`Server.submit`); None: it queues nothing itself."""
    needs: str | None = None
    """What the model must do for the route to exist (one of `Predictor.endpoints`, e.g. "classify");
    None: every model serves it."""
    counted: bool = False
    """A request that runs the model, as text-embeddings-inference counts them (te_request_count)."""
    secured: bool = True
    """Needs the API key when the server has one (the probes and /metrics do not)."""
    operation_id: str | None = None
    """The OpenAPI operationId where the path alone does not make it unique (the same handler twice)."""
    refusal: Callable[[Predictor], str] | None = None
    """Why a model that does not serve it cannot, for the 404 ("" when there is nothing to add)."""

    def served_by(self, predictor: Predictor) -> bool:
        return self.needs is None or self.needs in predictor.endpoints


def served(routes: Iterable[Route], predictor: Predictor) -> list[Route]:
    """The routes `predictor` serves, in table order."""
    return [route for route in routes if route.served_by(predictor)]


def paths(routes: Iterable[Route]) -> list[str]:
    """Each path once, in table order, and /docs (the OpenAPI page FastAPI adds): what 404s and /info list."""
    return list(dict.fromkeys([*(route.path for route in routes), "/docs"]))


def calls(routes: Iterable[Route]) -> dict[str, Call]:
    """The calls of `routes` by name: the micro-batcher's dispatch and cost."""
    return {route.call.name: route.call for route in routes if route.call is not None}


@dataclass(frozen=True)
class Server:
    """What a handler works with: the predictor, the settings, the served routes, and its route's call."""

    predictor: Predictor
    settings: ServerSettings
    batcher: MicroBatcher
    routes: tuple[Route, ...]
    """The routes this app serves."""
    call: Call | None = None
    """The call of the route being answered (`submit` queues under it)."""
    request: Request | None = None
    """The request being answered: `submit` drops its queued inputs when its client disconnects."""

    def at(self, path: str, method: str = "POST", request: Request | None = None) -> Server | None:
        """This server as the handler of `path` sees it (POST / answers as /embed, /rerank, ...), or None where
        that route is not served."""
        route = next((r for r in self.routes if r.path == path and r.method == method), None)
        return None if route is None else Server(self.predictor, self.settings, self.batcher, self.routes, route.call,
                                                 request or self.request)

    def count(self, options: Sequence[Any], items: list[Any]) -> list[int]:
        """The tokens the model will read for each item under this route's call (what the batcher counts)."""
        if self.call is None:
            raise TypeError("this route declares no call to count under")  # a bug in the route table
        return token_cost(self.predictor, {self.call.name: self.call})((self.call.name, *options), items)

    async def submit(self, options: Sequence[Any], items: list[Any], field: str = "inputs", paired: str = "",
                     names: list[str] | None = None) -> list[Any]:
        """The items' results, queued under this route's call with `options`; the batcher's refusals as HTTP
        errors. `field` and `paired` name an item in the message of an input over the maximum length:
        'texts[3]' and " with the query" (`paired` may name the index, "{i}"); or `names` gives each item's."""
        if self.call is None:
            raise TypeError("this route declares no call to submit under")  # a bug in the route table
        settings = self.settings
        request = self.request
        gone = (lambda: _disconnected(request)) if request is not None else None
        try:
            return await self.batcher.submit((self.call.name, *options), items, settings.timeout_s, gone)
        except ClientGoneError:
            raise RequestError(CLIENT_CLOSED, "client_closed", "the client closed the connection before its results "
                               "were ready; its inputs were dropped from the queue") from None
        except QueueFullError:
            raise RequestError(429, "queue_full", f"{settings.max_queue} requests are waiting; retry shortly") \
                from None
        except NotRunningError:
            raise RequestError(503, "shutting_down", "the server is shutting down") from None
        except TimeoutError:
            raise RequestError(504, "timeout", f"no result within {settings.timeout_s:g} s; retry with fewer or "
                               "shorter inputs") from None
        except InputTooLongError as exc:  # sent with "truncate": false
            name = names[exc.index] if names else f"'{field}[{exc.index}]'{paired.format(i=exc.index)}"
            raise FieldError(422, "too_many_tokens", f"`{field}` must have at most {exc.maximum} tokens: {name} "
                             f"has {exc.tokens}; shorten it, or send \"truncate\": true to cut it", field) from None


async def serving(request: Request) -> Server:
    """The `Server` of the route answering `request` (a FastAPI dependency of the handlers create_app registers
    from `server.routes`, so the route is there); 400 for a UTF-16 or UTF-32 body, which Python's JSON parser
    would read (JSON between systems is UTF-8, RFC 8259; TEI reads nothing else)."""
    body = await request.body()
    if body.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in body:  # what json.loads reads as UTF-16/32
        raise RequestError(400, "invalid_json", "the body is not valid JSON (its bytes are UTF-16 or UTF-32 text, "
                           "not UTF-8; send UTF-8)")
    server: Server = request.app.state.server
    return cast(Server, server.at(request.scope["route"].path, request.method, request))


async def _disconnected(request: Request) -> None:
    """Return when the client of `request` disconnects. Its body has been read, so the server's next message is
    the disconnect (uvicorn sends it when the connection closes, or once the response is complete)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
