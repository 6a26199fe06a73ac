"""Tokens as the model reads them, for /tokenize: ids, pieces, and where each piece is in the text, as byte
offsets (text-embeddings-inference's `start`/`stop`, into the text's UTF-8) and as character offsets
(`char_start`/`char_stop`, Python's indices). The two differ once a text has a character outside ASCII:
in "é the cat", `the` is bytes 3..6 and characters 2..5."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bertkit.tokenizer import WordPieceTokenizer


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
