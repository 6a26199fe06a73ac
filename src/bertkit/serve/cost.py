"""Token cost of one queued input: what the micro-batcher's `--max-batch-tokens` budget counts.

`token_cost(predictor)` returns `cost(key, item)`: the tokens the model will run for one input of a
request queued under `key` (the app's `(endpoint, *options)` tuple). A text or a pair (/classify,
/rerank) is [CLS] text [SEP] (pair [SEP]) cut at the model's maximum length (/embed and /v1/embeddings
with a sentence-transformers prompt first); a /fill-mask text counts each [MASK] as one token; a /tag
text or an /answer context counts every doc-stride window the task cuts it into, so a long context
weighs what it costs; /tokenize runs no model and counts 0. An item of a shape this module does not
know counts as a full sequence (the most one window can cost).

Design decision: counted when the request is queued (the batcher must know a batch's tokens before it
runs), on the event loop, with the tokenizer's fast Rust engine and ids only (`encode_ids`: no offsets,
no truncation bookkeeping), which is linear in the text and costs a few microseconds per sentence. The
predictor encodes the text again on the inference thread; a count is cheaper than carrying encodings
from the request to the predictor, whose features each task builds its own way. The counts equal the
lengths of the features the predictors build (tests/serve/test_token_batching.py).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, cast

from bertkit.serve.microbatch import Cost
from bertkit.serve.predictor import Predictor
from bertkit.tasks.windows import sliding_windows
from bertkit.tokenizer import MASK


def token_cost(predictor: Predictor) -> Cost:
    """`cost(key, item)`: the tokens `predictor`'s model runs for `item` queued under `key`."""
    tokenizer, max_length = predictor.tokenizer, predictor.max_seq_length
    task = cast(Any, getattr(predictor, "task", None))  # the task predictors' window settings

    def cost(key: Hashable, item: Any) -> int:
        endpoint = key[0] if isinstance(key, tuple) and key else key
        if endpoint == "tokenize":
            return 0  # the tokenizer alone: no model run
        if endpoint == "fill-mask" and isinstance(item, str):
            pieces = item.split(MASK)
            return min(sum(map(len, tokenizer.encode_ids(pieces))) + len(pieces) + 1, max_length)
        if endpoint == "tag" and task is not None and isinstance(item, str):
            [ids] = tokenizer.encode_ids([item])
            return _windows(len(ids), task.settings.max_seq_length - 2, task.settings.doc_stride, 2)
        if endpoint == "answer" and task is not None and _is_pair(item) and item[1] is not None:
            question, context = (len(ids) for ids in tokenizer.encode_ids(list(item)))
            question = min(question, task.settings.max_query_length)
            frame = question + 3  # [CLS] question [SEP] ... [SEP]
            return _windows(context, task.settings.max_seq_length - frame, task.settings.doc_stride, frame)
        if endpoint in ("embed", "embeddings") and predictor.sentence is not None and isinstance(item, str):
            item = predictor.sentence.prepare(item)
        if isinstance(item, str):
            return min(len(tokenizer.encode_ids([item])[0]) + 2, max_length)
        if _is_pair(item):
            texts = [text for text in item if text is not None]
            return min(sum(map(len, tokenizer.encode_ids(texts))) + len(texts) + 1, max_length)
        return max_length

    return cost


def _is_pair(item: Any) -> bool:
    return (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
            and (item[1] is None or isinstance(item[1], str)))


def _windows(length: int, window: int, stride: int, frame: int) -> int:
    """Tokens of the doc-stride windows over `length` tokens, each with `frame` tokens around it."""
    spans = sliding_windows(length, max(window, 1), stride)  # a window <= 0 is refused by the task itself
    return sum(size + frame for _, size in spans)
