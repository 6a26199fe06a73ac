"""Parity of bertkit's WordPiece tokenizer with Google's tokenization.py and with transformers.

`GoogleReference` below is our own plain rewrite of google-research/bert `tokenization.py`
(BasicTokenizer + WordpieceTokenizer, with the 100-character word cap of the issue and of
transformers; Google's file defaults to 200). transformers 5.23 still ships its slow port
(`tokenization_bert_legacy.BasicTokenizer`), but it departs from Google in two places - it applies
NFC before splitting and drops every C* character (unassigned, private use, surrogates) where
Google drops only Cc/Cf - so Google's rules are checked against our rewrite and transformers'
port only on text where those departures cannot show. Pairs are checked against transformers'
BertTokenizerFast in every field until truncation; truncated, they follow Google's
`_truncate_seq_pair` (the Rust library breaks ties the other way). The vocabulary is Google's bert-base-uncased
vocab.txt (tests/assets/vocab/bert-base-uncased, 30522 tokens).
"""

# The texts are deliberately confusable Unicode (fullwidth, fraktur, curly quotes):
# ruff: noqa: RUF001

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bertkit.tokenizer import WordPieceTokenizer, truncated_pair_lengths
from bertkit.tokenizer.engine import HAZARD_RANGES, Engine, needs_google_path
from bertkit.tokenizer.google import BasicTokenizer, FullTokenizer

GOOGLE_UNCASED = Path(__file__).parents[1] / "assets" / "vocab" / "bert-base-uncased"


class GoogleReference:
    """Google's BERT tokenization rules, written out plainly as the oracle for these tests."""

    def __init__(self, vocab: dict[str, int], do_lower_case: bool, max_chars: int = 100) -> None:
        self.vocab, self.do_lower_case, self.max_chars = vocab, do_lower_case, max_chars

    @staticmethod
    def is_whitespace(c: str) -> bool:
        return c in " \t\n\r" or unicodedata.category(c) == "Zs"

    @staticmethod
    def is_control(c: str) -> bool:
        return c not in "\t\n\r" and unicodedata.category(c) in ("Cc", "Cf")

    @staticmethod
    def is_punctuation(c: str) -> bool:
        cp = ord(c)
        ascii_symbol = 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
        return ascii_symbol or unicodedata.category(c).startswith("P")

    @staticmethod
    def is_cjk(cp: int) -> bool:
        ranges = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
                  (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]
        return any(lo <= cp <= hi for lo, hi in ranges)

    def basic(self, text: str) -> list[str]:
        kept = []
        for c in text:
            if ord(c) in (0, 0xFFFD) or self.is_control(c):
                continue
            kept.append(" " if self.is_whitespace(c) else c)
        spaced = "".join(f" {c} " if self.is_cjk(ord(c)) else c for c in kept)
        words = []
        for token in spaced.split():
            if self.do_lower_case:
                token = unicodedata.normalize("NFD", token.lower())
                token = "".join(c for c in token if unicodedata.category(c) != "Mn")
            current = ""
            for c in token:
                if self.is_punctuation(c):
                    words += [current, c] if current else [c]
                    current = ""
                else:
                    current += c
            if current:
                words.append(current)
        return " ".join(words).split()

    def wordpiece(self, word: str) -> list[str]:
        if len(word) > self.max_chars:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start and (("##" if start else "") + word[start:end]) not in self.vocab:
                end -= 1
            if end == start:
                return ["[UNK]"]
            pieces.append(("##" if start else "") + word[start:end])
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        return [piece for word in self.basic(text) for piece in self.wordpiece(word)]


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def pair(request) -> tuple[WordPieceTokenizer, GoogleReference]:
    tok = WordPieceTokenizer.from_pretrained(GOOGLE_UNCASED, do_lower_case=request.param)
    return tok, GoogleReference(tok.vocab, request.param)


VARIED_TEXTS = [
    "Hello, World! The naïve café’s crème brûlée costs €5.50 — isn't it?",
    "ÀÉÎÕÜ àéîõü ÅÆØ ß ẞ İstanbul Ångström ǅemal ﬁne",
    "东京是日本的首都。北京欢迎你！𠀀𪜀𫝀𫠠𬺰 한국어 テスト ひらがな",
    "emoji 😀👍🏽 👨‍👩‍👧 🇫🇷 ❤️ text",
    "control\x00chars\x07here\x1b[31m\u200b\u200d\ufeff\ufffd and \x0b\x0c\x1c\x85 seps",
    "tabs\tnew\nlines\r\nnbsp\u00a0ideographic\u3000line\u2028para\u2029sep",
    "punctuation!!!??? ...--- (([[{{}}]])) @#$%^&*_+=|\\/<>~` «quotes» „low“ ‘single’",
    "supercalifragilisticexpialidocious " + "pneumono" * 14 + " " + "x" * 101 + " " + "y" * 100,
    "ΟΔΟΣ ΣΑΣ. ΑΣ中 Σ σς ΣΣ aΣ' ΑΣ.Α",
    "e\u0301 a\u0308\u0301 \u0301lone combining\u0327\u0300 marks \u1100\u1161\u11a8 한",
    "private\ue000use \U000f0000plane15 unassigned\u0378\U0002fffe noncharacter\uffff",
    "ℌ𝔢𝔩𝔩𝔬 ①②③ ½ ㎏ Ｆｕｌｌｗｉｄｔｈ",
    "", "   ", "\x00\x01\x02", "[CLS] [MASK] [SEP] not special in Google's code",
    "\u0890\u08e2 \u2e52 \U0002b820\U0002b91f \u180f\u166d new-Unicode characters",
]


def test_google_vocab_ids_are_kept():
    tok = WordPieceTokenizer.from_pretrained(GOOGLE_UNCASED)
    assert tok.vocab_size == 30522 and tok.do_lower_case
    specials = (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id)
    assert specials == (0, 100, 101, 102, 103)
    lines = (GOOGLE_UNCASED / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert tok.convert_ids_to_tokens(list(range(30522))) == lines
    assert tok.vocab_hash == "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_varied_text_matches_google(pair, text):
    tok, ref = pair
    assert tok.tokenize(text) == ref.tokenize(text)
    assert tok.encode_ids([text]) == [tok.convert_tokens_to_ids(ref.tokenize(text))]


def test_batch_mixing_rust_and_python_paths_matches_google(pair):
    tok, ref = pair
    expected = [tok.convert_tokens_to_ids(ref.tokenize(t)) for t in VARIED_TEXTS]
    assert tok.encode_ids(VARIED_TEXTS) == expected
    assert [e.input_ids[1:-1] for e in tok.encode_batch(VARIED_TEXTS)] == expected


# Every kind of character: all planes, surrogates and private use included.
any_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=60)
mixed_text = st.lists(
    st.one_of(any_text, st.sampled_from(["ΣΑΣ", "Café", "東京", "x" * 101, "\ue000", "! ", " ", "e\u0301"])),
    max_size=6,
).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mixed_text)
def test_random_unicode_matches_google(pair, text):
    tok, ref = pair
    assert tok.tokenize(text) == ref.tokenize(text)


@settings(max_examples=150, deadline=None)
@given(text=mixed_text, lower=st.booleans())
def test_python_path_words_match_google(text, lower):
    ref = GoogleReference({}, lower)
    assert [w.text for w in BasicTokenizer(lower).tokenize(text)] == ref.basic(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mixed_text)
# Canonical reordering of two marks that accent stripping drops (U+0300 after U+1E8D0) keeps the letter's span.
@example(text="\u00d9\U0001e8d0b")
# A syllable that decomposes into two jamo, then a dropped control character: the jamo share the syllable's span.
@example(text="\ucfe0\x080")
def test_google_module_alone_matches_google_and_the_rust_pipeline(pair, text):
    """`bertkit.tokenizer.google` on any text, not only the texts routed to it: Google's ids, and where
    the Rust pipeline is exact (no hazard character), the same offsets and word ids as it."""
    tok, ref = pair
    pieces = FullTokenizer(tok.vocab, tok.do_lower_case, "[UNK]").encode(text)
    assert pieces.ids == tok.convert_tokens_to_ids(ref.tokenize(text))
    if not needs_google_path(text):
        rust = tok._engine.pipeline.encode(text, add_special_tokens=False)
        assert (pieces.offsets, pieces.word_ids) == (rust.offsets, rust.word_ids)


def _sigma_folded(text: str) -> str:
    # Final sigma depends on the neighbours, which a token's own span lacks.
    return text.replace("\u03c2", "\u03c3")


def _normalized(text: str, lower: bool) -> str:
    return _sigma_folded("".join(GoogleReference({}, lower).basic(text)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mixed_text)
def test_offsets_map_back_to_the_original_text(pair, text):
    tok, _ = pair
    enc = tok.encode(text)
    previous_start = 0
    for token, (start, end), seq in zip(enc.tokens, enc.offsets, enc.sequence_ids):
        if seq is None:
            assert (start, end) == (0, 0)
            continue
        assert previous_start <= start < end <= len(text)
        previous_start = start
        if token != "[UNK]":
            assert _sigma_folded(token.removeprefix("##")) in _normalized(text[start:end], tok.do_lower_case)


def _in_hazard_ranges(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in HAZARD_RANGES)


def _rust_agrees_outside_hazards(tok: WordPieceTokenizer, ref: GoogleReference, planes: range) -> list[int]:
    """Code points outside HAZARD_RANGES where the Rust normalizer + pre-tokenizer differ from Google."""
    rust = Engine(tok.vocab, tok.do_lower_case).pipeline
    safe = [cp for cp in range(planes.start * 0x10000, planes.stop * 0x10000) if not _in_hazard_ranges(cp)]
    bad = []
    for i in range(0, len(safe), 512):
        chunk = safe[i : i + 512]
        text = " ".join(f"a{chr(cp)}b" for cp in chunk)
        words = [w for w, _ in rust.pre_tokenizer.pre_tokenize_str(rust.normalizer.normalize_str(text))]
        if words != ref.basic(text):
            bad += [cp for cp in chunk if ref.basic(f"a{chr(cp)}b") != [
                w for w, _ in rust.pre_tokenizer.pre_tokenize_str(rust.normalizer.normalize_str(f"a{chr(cp)}b"))]]
    return bad


def test_rust_pipeline_agrees_with_google_outside_hazards_bmp(pair):
    tok, ref = pair
    assert _rust_agrees_outside_hazards(tok, ref, range(1)) == []


@pytest.mark.slow
def test_rust_pipeline_agrees_with_google_outside_hazards_all_planes(pair):
    tok, ref = pair
    assert _rust_agrees_outside_hazards(tok, ref, range(17)) == []


def _transformers_slow(do_lower_case: bool, vocab: dict[str, int] | None = None):
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    vocab = vocab or WordPieceTokenizer.from_pretrained(GOOGLE_UNCASED).vocab
    basic = legacy.BasicTokenizer(do_lower_case=do_lower_case)
    wordpiece = legacy.WordpieceTokenizer(vocab=vocab, unk_token="[UNK]")
    return lambda text: [p for w in basic.tokenize(text) for p in wordpiece.tokenize(w)]


def _outside_transformers_departures(text: str) -> bool:
    """Text on which transformers' NFC step and C* dropping cannot change the result."""
    no_other = all(not unicodedata.category(c).startswith("C") or c in "\t\n\r"
                   or unicodedata.category(c) in ("Cc", "Cf") for c in text)
    return no_other and unicodedata.normalize("NFC", text) == text


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_matches_transformers_slow_tokenizer(lower):
    slow = _transformers_slow(lower)
    tok = WordPieceTokenizer.from_pretrained(GOOGLE_UNCASED, do_lower_case=lower)
    texts = [t for t in VARIED_TEXTS if _outside_transformers_departures(t)]
    assert len(texts) >= 12
    for text in texts:
        assert tok.tokenize(text) == slow(text), text


def test_transformers_departures_from_google_are_real():
    """Where transformers' slow port departs from Google, bertkit follows Google."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u00e9", "ab"]
    tok = WordPieceTokenizer(tokens, do_lower_case=False)
    ref = GoogleReference(tok.vocab, do_lower_case=False)
    slow = _transformers_slow(False, tok.vocab)
    # NFC composes e + U+0301 into the vocabulary's é; C* dropping removes private-use U+E000.
    for text in ["e\u0301", "a\ue000b"]:
        assert tok.tokenize(text) == ref.tokenize(text) == ["[UNK]"] != slow(text)


@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_pairs_match_transformers_fast_and_truncate_by_google_rule(lower):
    transformers = pytest.importorskip("transformers")
    fast = transformers.BertTokenizerFast(vocab=str(GOOGLE_UNCASED / "vocab.txt"), do_lower_case=lower)
    tok = WordPieceTokenizer.from_pretrained(GOOGLE_UNCASED, do_lower_case=lower)
    # transformers' fast tokenizer is the Rust pipeline, so it departs from Google wherever ours
    # takes the Python path; it treats an empty second text as no pair; it matches "[MASK]" in text.
    texts = [t for t in VARIED_TEXTS if not needs_google_path(t) and "[" not in t and t.strip()]
    assert len(texts) >= 8
    for a, b in zip(texts, texts[1:] + texts[:1]):
        ours = tok.encode(a, b)
        theirs = fast(a, b, return_offsets_mapping=True)
        for field in ("input_ids", "token_type_ids", "attention_mask"):
            assert getattr(ours, field) == theirs[field], (a, b, field)
        assert ours.offsets == theirs["offset_mapping"] and ours.word_ids == theirs.word_ids()
        assert ours.sequence_ids == theirs.sequence_ids() and not ours.truncated
        for max_length in (5, 8, 16, 64):
            cut = tok.encode(a, b, max_length=max_length)
            len_a, len_b = ours.sequence_ids.count(0), ours.sequence_ids.count(1)
            kept = truncated_pair_lengths(len_a, len_b, max_length - 3)
            assert (cut.sequence_ids.count(0), cut.sequence_ids.count(1)) == kept
            assert cut.num_truncated == len_a + len_b - sum(kept)
            for field in FIELDS_BY_TOKEN:
                whole, part = getattr(ours, field), getattr(cut, field)
                assert part == whole[: kept[0] + 1] + whole[len_a + 1 : len_a + 2 + kept[1]] + whole[-1:], field


FIELDS_BY_TOKEN = ("input_ids", "tokens", "offsets", "word_ids", "sequence_ids")
