"""Token cost of queued inputs: what the micro-batcher's `--max-batch-tokens` budget counts.

`token_cost(predictor, calls)` returns `cost(key, items)`: the tokens the model will run for each input of a
request queued under `key` (a route's `(call name, *options)`, bertkit.serve.routing), counted by the call's
own `cost` (declared with the call in bertkit.serve.routes), else as one sequence each. A text or a pair
(/classify, /rerank) is [CLS] text [SEP] (pair [SEP]) cut at the model's maximum length (/embed and
/v1/embeddings with a sentence-transformers prompt first: `prompted_costs`); a /fill-mask text counts each
[MASK] as one token (`fill_mask_costs`); a /tag text (`tag_costs`), an /answer context (`answer_costs`) and a
/classify input of a classifier with --long-documents windows (`classify_costs`) count every window the task
cuts them into, so a long text weighs what it costs; /tokenize runs no model and counts 0 (`no_cost`). An item
of a shape this module does not know counts as a full sequence (the most one window can cost).

Design decision: counted when the request is queued (the batcher must know a batch's tokens before it
runs), on the event loop, so it must be cheap for any request the limits let in (up to --max-inputs texts
of --max-input-chars): one call of the tokenizer's fast engine per request, ids only (no offsets, no
truncation bookkeeping), and where the count is cut at the maximum length, only a prefix of each long
text is encoded: cut at a space, its tokens are exactly the first tokens of the whole text, so once they
reach the maximum the rest cannot change the count (the whole text is encoded when they do not). The
predictor encodes the texts again on the inference thread; counting is cheaper than carrying encodings
from the request to the predictor, whose features each task builds its own way. The counts equal the
lengths of the features the predictors build (tests/serve/test_token_batching.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, cast

from bertkit.serve.microbatch import Cost
from bertkit.serve.predictor import Predictor
from bertkit.serve.tokens import Ids
from bertkit.tasks.long_documents import plan_windows
from bertkit.tasks.windows import sliding_windows
from bertkit.tokenizer import MASK, WordPieceTokenizer

if TYPE_CHECKING:  # the route table's calls name these functions; counting needs no web stack
    from bertkit.serve.routing import Call

CHARS_PER_TOKEN = 8  # a prefix of 8 characters per token wanted is cut; English averages 4-5 per token


def token_cost(predictor: Predictor, calls: Mapping[str, Call]) -> Cost:
    """`cost(key, items)`: the tokens `predictor`'s model runs for each item queued under `key`."""
    def cost(key: Hashable, items: list[Any]) -> list[int]:
        name, *options = cast(tuple[Any, ...], key)  # the routes queue (call name, *options) tuples
        call = calls.get(name)
        count = call.cost if call is not None and call.cost is not None else sequence_costs
        return count(predictor, tuple(options), items)

    return cost


def sequence_costs(predictor: Predictor, options: tuple[Any, ...], items: list[Any]) -> list[int]:
    """Each item as one sequence cut at the model's maximum length (`_sequence_costs`)."""
    return _sequence_costs(predictor.tokenizer, items, predictor.max_seq_length)


def no_cost(predictor: Predictor, options: tuple[Any, ...], items: list[Any]) -> list[int]:
    """0 for each item: the tokenizer alone, no model run."""
    return [0] * len(items)


def prompted_costs(predictor: Predictor, options: tuple[Any, ...], items: list[Any]) -> list[int]:
    """Texts as the model reads them: a sentence-transformers directory's prompt first (the options of these
    calls end with the request's prompt_name)."""
    if predictor.sentence is not None:
        prompt_name = options[-1] if options else None
        items = [predictor.sentence.prepare(item, prompt_name=prompt_name) if isinstance(item, str) else item
                 for item in items]
    return sequence_costs(predictor, options, items)


def fill_mask_costs(predictor: Predictor, options: tuple[Any, ...], items: list[Any]) -> list[int]:
    """[CLS] pieces [SEP] with each [MASK] one token."""
    if not all(isinstance(item, str) for item in items):
        return sequence_costs(predictor, options, items)
    pieces = [item.split(MASK) for item in items]
    max_length = predictor.max_seq_length
    lengths = iter(_lengths(predictor.tokenizer, [p for parts in pieces for p in parts], max_length))
    return [min(sum(next(lengths) for _ in parts) + len(parts) + 1, max_length) for parts in pieces]


def tag_costs(predictor: Predictor, options: tuple[Any, ...], items: list[Any]) -> list[int]:
    """The tagger's doc-stride windows over each text."""
    task = getattr(predictor, "task", None)
    if task is None or not all(isinstance(item, str) for item in items):
        return sequence_costs(predictor, options, items)
    s = task.settings
    return [_windows(n, s.max_seq_length - 2, s.doc_stride, 2) for n in _lengths(predictor.tokenizer, items)]


def answer_costs(predictor: Predictor, options: tuple[Any, ...], items: list[Any]) -> list[int]:
    """The reader's [CLS] question [SEP] window [SEP] features of each (question, context)."""
    task = getattr(predictor, "task", None)
    if task is None or not all(_is_pair(item) and item[1] is not None for item in items):
        return sequence_costs(predictor, options, items)
    return _answer_costs(predictor.tokenizer, task.settings, items)


def classify_costs(predictor: Predictor, options: tuple[Any, ...], items: list[Any]) -> list[int]:
    """A classifier with --long-documents windows: every window of each (text, pair or None); else a sequence."""
    settings = getattr(getattr(predictor, "task", None), "settings", None)
    if getattr(settings, "long_documents", None) != "windows" or not all(_is_pair(item) for item in items):
        return sequence_costs(predictor, options, items)
    return _window_costs(predictor.tokenizer, settings, items)


def _sequence_costs(tokenizer: WordPieceTokenizer, items: list[Any], max_length: int) -> list[int]:
    """[CLS] text [SEP], [CLS] a [SEP] b [SEP] or [CLS] ids [SEP], cut at `max_length`; `max_length` for other
    items."""
    parts = [[item] if isinstance(item, str) else [t for t in item if t is not None] if _is_pair(item) else []
             for item in items]
    lengths = iter(_lengths(tokenizer, [text for texts in parts for text in texts], max_length))
    return [min(len(item) + 2, max_length) if isinstance(item, Ids) else
            min(sum(next(lengths) for _ in texts) + len(texts) + 1, max_length) if texts else max_length
            for item, texts in zip(items, parts)]


def _answer_costs(tokenizer: WordPieceTokenizer, settings: Any, items: list[Any]) -> list[int]:
    """Tokens of the [CLS] question [SEP] window [SEP] features of each (question, context)."""
    questions = _lengths(tokenizer, [q for q, _ in items], settings.max_query_length)
    contexts = _lengths(tokenizer, [c for _, c in items])
    costs = []
    for question, context in zip(questions, contexts):
        frame = min(question, settings.max_query_length) + 3  # [CLS] question [SEP] ... [SEP]
        costs.append(_windows(context, settings.max_seq_length - frame, settings.doc_stride, frame))
    return costs


def _window_costs(tokenizer: WordPieceTokenizer, settings: Any, items: list[Any]) -> list[int]:
    """Tokens of the windows a classifier with --long-documents windows reads each (text, pair or None) in."""
    firsts = _lengths(tokenizer, [text for text, _ in items])
    seconds = _lengths(tokenizer, [pair or "" for _, pair in items])
    return [plan_windows(first, None if pair is None else second, settings.max_seq_length, settings.doc_stride,
                         settings.max_windows).tokens for (_, pair), first, second in zip(items, firsts, seconds)]


def _lengths(tokenizer: WordPieceTokenizer, texts: list[str], at_least: int | None = None) -> list[int]:
    """Token count of each text (no specials); with `at_least`, exact up to it: a count of `at_least` or
    more means that many or more."""
    if at_least is None:
        return [len(ids) for ids in tokenizer.encode_ids(texts)]
    limit = at_least * CHARS_PER_TOKEN
    prefixes = [_prefix(text, limit) for text in texts]
    lengths = [len(ids) for ids in tokenizer.encode_ids(prefixes)]
    short = [i for i, (text, n) in enumerate(zip(texts, lengths)) if n < at_least and len(prefixes[i]) < len(text)]
    for i, ids in zip(short, tokenizer.encode_ids([texts[i] for i in short])):  # few words in many characters
        lengths[i] = len(ids)
    return lengths


def _prefix(text: str, limit: int) -> str:
    """`text` cut at its last space within `limit` characters (whole words, so their tokens are the
    text's first tokens), or the whole text."""
    if len(text) <= limit:
        return text
    space = text.rfind(" ", 0, limit)
    return text[:space] if space > 0 else text


def _is_pair(item: Any) -> bool:
    return (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
            and (item[1] is None or isinstance(item[1], str)))


def _windows(length: int, window: int, stride: int, frame: int) -> int:
    """Tokens of the doc-stride windows over `length` tokens, each with `frame` tokens around it."""
    spans = sliding_windows(length, max(window, 1), stride)  # a window <= 0 is refused by the task itself
    return sum(size + frame for _, size in spans)
