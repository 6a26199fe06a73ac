"""The vocabulary on disk: vocab.txt, Hugging Face tokenizer.json and tokenizer_config.json, read,
checked and written.

Design decision: ids are exactly the file's line numbers (Google's `load_vocab`, lines stripped,
CRLF accepted), and where Google's loader silently does something harmful the file is refused
with a message naming the line: an empty line (deleting it would shift every later id), a
duplicate token (two ids for one string), bytes that are not UTF-8, a missing special token. A
tokenizer.json is read only for its WordPiece vocabulary and its normalizer's lower-casing.
Writing gives vocab.txt plus a transformers-compatible tokenizer_config.json, atomically.

Whether a special token's literal in a text ("a [SEP] b") is that token is the directory's, read as
transformers reads it, so bertkit and transformers (and sentence-transformers, which tokenizes with it) give
one text the same ids: tokenizer_config.json's `split_special_tokens` when it says; else, in a directory
transformers loads (a tokenizer_config.json, tokenizer.json or config.json beside the vocabulary), transformers'
default: the literal is the special token; else (a vocab.txt alone, as Google releases it) Google's rule: it is
text ("[", "sep", "]"). bertkit writes the key, so a directory it saved reads the same everywhere.

References: google-research/bert `tokenization.py` (`load_vocab`); Hugging Face tokenizers'
tokenizer.json format and transformers' BertTokenizer configuration.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, where
from bertkit.io.atomic import write_text_atomic
from bertkit.io.bounded import file_present, read_bounded
from bertkit.io.jsonfile import read_json_object

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, CLS, SEP, MASK)
"""Order of the specials at the head of a freshly trained vocabulary (ids 0..4)."""
VOCAB_FILE = "vocab.txt"
TOKENIZER_JSON = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TRANSFORMERS_FILES = (CONFIG_FILE, TOKENIZER_JSON, "config.json")
"""Files that make a vocabulary's directory one transformers loads (its rules apply to text there)."""


def load(path: str | Path, do_lower_case: bool | None, split_special_tokens: bool | None = None,
         ) -> tuple[list[str], bool, bool, str]:
    """(tokens in id order, do_lower_case, split_special_tokens, the file read) of a directory holding vocab.txt
    or tokenizer.json, or of either file. do_lower_case=None reads it from tokenizer_config.json beside
    the vocabulary, else from tokenizer.json's normalizer, else True; split_special_tokens=None as the module
    docstring says."""
    source = _vocabulary_file(Path(path))
    if source.suffix == ".json":
        tokens, json_lower_case, normalizer = _read_tokenizer_json(source)
    else:
        tokens, json_lower_case, normalizer = _read_vocab(source), None, {}
    config_path = source.parent / CONFIG_FILE
    raw = read_json_object(config_path, fix="fix or delete the file") if file_present(config_path) else {}
    config = _followed_keys(raw, config_path)
    declared = next((v for v in (config.get("do_lower_case"), json_lower_case) if v is not None), True)
    if do_lower_case is None:
        do_lower_case = declared
    _check_added_tokens(source.parent, tokens, raw.get("added_tokens_decoder"))
    # the tokenizer's own rules against its own casing (a caller may force another: a vocabulary compared only)
    _check_text_rules(config_path, declared, raw)
    _check_text_rules(source, declared, normalizer)
    if split_special_tokens is None:
        transformers_layout = any((source.parent / name).is_file() for name in TRANSFORMERS_FILES)
        split_special_tokens = config.get("split_special_tokens", not transformers_layout)
    return tokens, do_lower_case, split_special_tokens, str(source)


def save(directory: str | Path, tokens: Sequence[str], do_lower_case: bool, split_special_tokens: bool) -> Path:
    """Write vocab.txt and a transformers-compatible tokenizer_config.json; return the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_text_atomic(directory / VOCAB_FILE, vocab_text(tokens))
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": do_lower_case,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "split_special_tokens": split_special_tokens,
        "unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK,
    }
    write_text_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    return directory


def vocab_text(tokens: Sequence[str]) -> str:
    """vocab.txt as `save` writes it: one token per line, LF endings."""
    return "".join(token + "\n" for token in tokens)


def check(tokens: Sequence[str], source: str) -> None:
    """Reject what Google's loader would silently mis-handle: empty lines, duplicates, no specials."""
    first_line: dict[str, int] = {}
    for number, token in enumerate(tokens, 1):
        if not token:
            raise BertkitError(f"{where(source, number)}: empty vocabulary line; every line holds one "
                               "token whose id is its line number - 1, so put a placeholder such as "
                               "[unused0] there (deleting the line would shift every later id)")
        if token in first_line:
            raise BertkitError(f"{where(source, number)}: duplicate token {token!r} (also on line "
                               f"{first_line[token]}); one token cannot have two ids, so replace one "
                               "of them with an unused placeholder")
        first_line[token] = number
    missing = [t for t in SPECIAL_TOKENS if t not in first_line]
    if missing:
        raise BertkitError(f"{source}: vocabulary lacks {', '.join(missing)}; BERT needs "
                           f"{', '.join(SPECIAL_TOKENS)} (add them as lines of {VOCAB_FILE})")


def _vocabulary_file(path: Path) -> Path:
    """vocab.txt or tokenizer.json: the path itself, or the first of them in the directory."""
    if not path.exists():
        raise BertkitError(f"tokenizer path {path} does not exist; pass a directory holding {VOCAB_FILE} or "
                           f"{TOKENIZER_JSON} (e.g. the output of `bertkit tokenizer train`) or one of those files")
    if not path.is_dir():
        return path
    for name in (VOCAB_FILE, TOKENIZER_JSON):
        if file_present(path / name):
            return path / name
    raise BertkitError(f"no vocabulary in {path}: it holds neither {VOCAB_FILE} nor {TOKENIZER_JSON}; pass the "
                       "directory of a BERT tokenizer (e.g. the output of `bertkit tokenizer train`)")


MAX_VOCAB_BYTES = 64 << 20
"""Largest vocab.txt read: 250,000 tokens (the largest multilingual vocabularies) take a few MB."""


def _read_vocab(path: Path) -> list[str]:
    """vocab.txt lines -> tokens (id = line index), stripped as Google's loader strips them."""
    try:
        raw = read_bounded(path, MAX_VOCAB_BYTES, "a vocabulary", decompress=False)
    except OSError as exc:
        raise BertkitError(f"cannot read vocabulary {path}: {exc.strerror}; pass a directory holding "
                           f"{VOCAB_FILE} or the path of a {VOCAB_FILE} file") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise BertkitError(f"{where(path, line)}: vocabulary is not valid UTF-8; re-save it as UTF-8") from exc
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]


def _check_added_tokens(directory: Path, tokens: list[str], decoder: object) -> None:
    """Refuse tokens transformers adds beside vocab.txt (added_tokens.json, tokenizer_config.json's
    added_tokens_decoder: `decoder`) that the vocabulary lacks at their ids: bertkit would read them as [UNK],
    quietly."""
    added = dict(read_json_object(directory / "added_tokens.json", missing={}, damaged={}))
    if isinstance(decoder, dict):
        added |= {entry["content"]: int(i) for i, entry in decoder.items()
                  if isinstance(entry, dict) and isinstance(entry.get("content"), str) and str(i).isdigit()}
    extra = [token for token, i in added.items() if not (isinstance(i, int) and 0 <= i < len(tokens)
                                                         and tokens[i] == token)]
    if extra:
        raise BertkitError(f"{directory}: added tokens {extra[:5]} (added_tokens.json or {CONFIG_FILE}) are not in "
                           f"{VOCAB_FILE} at their ids; bertkit reads only the WordPiece vocabulary, so they would "
                           "be read as [UNK]: use transformers for this tokenizer, or add them to vocab.txt at those "
                           "ids")


def _bert_normalizer(normalizer: object) -> dict[str, Any]:
    """tokenizer.json's BertNormalizer settings (inside a Sequence too), as tokenizer_config.json names them."""
    if not isinstance(normalizer, dict):
        return {}
    if normalizer.get("type") == "BertNormalizer":
        return {"strip_accents": normalizer.get("strip_accents"),
                "tokenize_chinese_chars": normalizer.get("handle_chinese_chars", True)}
    return next((found for n in normalizer.get("normalizers") or [] if (found := _bert_normalizer(n))), {})


def _check_text_rules(path: Path, do_lower_case: bool, rules: dict[str, Any]) -> None:
    """Refuse accent and CJK rules (`rules`: tokenizer_config.json's, or tokenizer.json's normalizer's, read from
    `path`) other than Google's BasicTokenizer's, which bertkit's tokenizer follows: accents stripped exactly when
    text is lower-cased, CJK characters split apart."""
    strip, chinese = rules.get("strip_accents"), rules.get("tokenize_chinese_chars", True)
    if strip is not None and strip != do_lower_case:
        raise BertkitError(f"{path}: strip_accents {str(strip).lower()} with do_lower_case {str(do_lower_case).lower()}"
                           f": bertkit's tokenizer strips accents exactly when it lower-cases (Google's rule), so "
                           "its token ids would differ from this tokenizer's; use transformers for this tokenizer")
    if chinese is False:
        raise BertkitError(f"{path}: tokenize_chinese_chars false: bertkit's tokenizer splits every CJK character "
                           "apart (Google's rule), so its token ids would differ; use transformers for this tokenizer")


def _followed_keys(config: dict[str, Any], config_path: Path) -> dict[str, bool]:
    """The keys of tokenizer_config.json (`config`; {} when absent) that bertkit follows (do_lower_case,
    split_special_tokens), those set."""
    found = {key: config[key] for key in ("do_lower_case", "split_special_tokens") if config.get(key) is not None}
    for key, value in found.items():
        if not isinstance(value, bool):
            raise BertkitError(f"{config_path}: {key} must be true or false, got {value!r}")
    return found


def _read_tokenizer_json(path: Path) -> tuple[list[str], bool | None, dict[str, Any]]:
    """(tokens in id order, lower-casing of its normalizer or None, its BertNormalizer's accent and CJK rules) of a
    Hugging Face tokenizer.json."""
    spec = read_json_object(path, fix="fix or delete the file")
    model = spec.get("model") or {}
    if model.get("type") != "WordPiece" or model.get("continuing_subword_prefix", "##") != "##":
        raise BertkitError(f"{path}: the tokenizer's model is {model.get('type')!r} (prefix "
                           f"{model.get('continuing_subword_prefix')!r}), not BERT's WordPiece with '##' "
                           "continuations; bertkit loads only WordPiece vocabularies")
    vocab = model.get("vocab")
    ids = sorted(vocab.values()) if isinstance(vocab, dict) and all(type(i) is int for i in vocab.values()) else None
    if not isinstance(vocab, dict) or not ids or ids != list(range(len(ids))):
        raise BertkitError(f"{path}: model.vocab must map each token to a distinct id 0..N-1; the file is not "
                           "a complete WordPiece tokenizer")
    extra = [t["content"] for t in spec.get("added_tokens") or [] if vocab.get(t.get("content")) != t.get("id")]
    if extra:
        raise BertkitError(f"{path}: added tokens {extra[:5]} are not in model.vocab with the same id; bertkit "
                           "reads only the WordPiece vocabulary")
    normalizer = spec.get("normalizer")
    return sorted(vocab, key=vocab.__getitem__), _normalizer_lower_case(normalizer), _bert_normalizer(normalizer)


def _normalizer_lower_case(normalizer: object) -> bool | None:
    """Whether a tokenizer.json normalizer lower-cases (None when it has none bertkit knows)."""
    if not isinstance(normalizer, dict):
        return None
    if normalizer.get("type") == "BertNormalizer":
        return bool(normalizer.get("lowercase", True))
    if normalizer.get("type") == "Lowercase":
        return True
    found = [_normalizer_lower_case(n) for n in normalizer.get("normalizers") or []]  # a Sequence
    return True if True in found else False if False in found else None
