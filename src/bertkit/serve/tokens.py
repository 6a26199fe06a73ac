"""Tokens as the model reads them: for /tokenize, ids, pieces, and where each piece is in the text, as byte
offsets (text-embeddings-inference's `start`/`stop`, into the text's UTF-8) and as character offsets
(`char_start`/`char_stop`, Python's indices; the two differ once a text has a character outside ASCII: in
"é the cat", `the` is bytes 3..6 and characters 2..5); the features of an input sent as token ids (`Ids`); and
left truncation (`keep_end`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertkit.tokenizer import WordPieceTokenizer, truncated_pair_lengths


class Ids(tuple):
    """An input sent as this model's token ids (TEI's and OpenAI's token-id inputs), [CLS] and [SEP] left out:
    the model reads [CLS] ids [SEP], the ids as they are (an [UNK] stays [UNK])."""


def ids_feature(ids: Ids, max_length: int, cls: int, sep: int, direction: str) -> tuple[dict[str, Any], int]:
    """The feature [CLS] ids [SEP] cut to `max_length` from the `direction` end, and the ids it lost."""
    room = max(max_length - 2, 0)
    kept = list(ids[:room]) if direction == "right" else list(ids[max(len(ids) - room, 0):])
    out = [cls, *kept, sep]
    return {"input_ids": out, "token_type_ids": [0] * len(out), "attention_mask": [1] * len(out)}, len(ids) - len(kept)


def keep_end(encoding: Any, max_length: int, cls: int, sep: int) -> dict[str, Any]:
    """The feature of an untruncated encoding cut from the left: each text keeps as many tokens as Google's
    pair rule gives it, its last ones, so the kept lengths equal those of right truncation."""
    ids, first = encoding.input_ids, encoding.token_type_ids.count(0)  # [CLS] A [SEP] are type 0
    if len(ids) <= max_length:
        return {"input_ids": ids, "token_type_ids": encoding.token_type_ids, "attention_mask": encoding.attention_mask}
    texts = [ids[1:first - 1]] + ([ids[first:-1]] if first < len(ids) else [])
    room = max(max_length - len(texts) - 1, 0)
    kept = (min(len(texts[0]), room),) if len(texts) == 1 else \
        truncated_pair_lengths(len(texts[0]), len(texts[1]), room)
    out = [cls]
    for tokens, n in zip(texts, kept):
        out += [*tokens[len(tokens) - n:], sep]
    types = [0] * (kept[0] + 2) + [1] * (len(out) - kept[0] - 2)
    return {"input_ids": out, "token_type_ids": types, "attention_mask": [1] * len(out)}


def token_table(tokenizer: WordPieceTokenizer, texts: Sequence[str], add_special_tokens: bool = True
                ) -> list[list[dict[str, Any]]]:
    """Per text, its tokens, never truncated: {id, text, special, start, stop, char_start, char_stop}. `text` is
    the piece's slice of the text; [CLS] and [SEP] have their own name as text and None offsets."""
    out = []
    for text, encoding in zip(texts, tokenizer.encode_batch(texts, truncation=False)):
        tokens = []
        byte_offsets = _byte_offsets(text)
        for token_id, name, (start, stop), sequence in zip(encoding.input_ids, encoding.tokens, encoding.offsets,
                                                           encoding.sequence_ids):
            if sequence is None:  # [CLS] or [SEP]
                if add_special_tokens:
                    tokens.append({"id": token_id, "text": name, "special": True, "start": None, "stop": None,
                                   "char_start": None, "char_stop": None})
            else:
                tokens.append({"id": token_id, "text": text[start:stop], "special": False,
                               "start": byte_offsets[start], "stop": byte_offsets[stop],
                               "char_start": start, "char_stop": stop})
        out.append(tokens)
    return out


def _byte_offsets(text: str) -> list[int]:
    """For each character offset 0..len(text), the byte offset in the text's UTF-8."""
    offsets, total = [0], 0
    for character in text:
        total += len(character.encode("utf-8", "surrogatepass"))
        offsets.append(total)
    return offsets
