"""Tests of bertkit.tokenizer: Google's tokenization_test cases, encoding layout, offsets, vocab I/O, training, CLI.

Parity with a reference port of Google's code and transformers lives in test_google_parity.py;
robustness (hypothesis, huge and hostile strings) in test_robustness.py.
"""

from __future__ import annotations

import gzip
import json

import pytest

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.tokenizer import SPECIAL_TOKENS, WordPieceTokenizer

# The inline vocabulary of Google's tokenization_test.py, with the five specials first.
GOOGLE_TEST_VOCAB = [*SPECIAL_TOKENS, "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",", "low", "lowest"]


@pytest.fixture(scope="module")
def uncased() -> WordPieceTokenizer:
    return WordPieceTokenizer(GOOGLE_TEST_VOCAB, do_lower_case=True)


def test_google_full_tokenizer_case(uncased):
    assert uncased.tokenize("UNwant\u00e9d,running") == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert uncased.convert_tokens_to_ids(["un", "##want", "##ed", ",", "runn", "##ing"]) == [9, 6, 7, 12, 10, 11]


def test_google_wordpiece_cases(uncased):
    assert uncased.tokenize("") == []
    assert uncased.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    assert uncased.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]


def test_google_basic_cases():
    tokens = [*SPECIAL_TOKENS, "hello", "how", "are", "you", "?", "!", "HeLLo", "ah",
              "##\u535a", "\u535a", "\u63a8", "ahbo"]
    lower = WordPieceTokenizer(tokens, do_lower_case=True)
    cased = WordPieceTokenizer(tokens, do_lower_case=False)
    assert lower.tokenize(" \tHeLLo!how  \n Are yoU?  ") == ["hello", "!", "how", "are", "you", "?"]
    assert lower.tokenize("H\u00e9llo") == ["hello"]
    assert cased.tokenize(" \tHeLLo!how  \n Are yoU?  ") == ["HeLLo", "!", "how", "[UNK]", "[UNK]", "?"]
    # CJK characters become words of their own, so "##博" is never used.
    assert lower.tokenize("ah\u535a\u63a8zz") == ["ah", "\u535a", "\u63a8", "[UNK]"]


def test_control_and_whitespace_cleaning(uncased):
    # Cc/Cf characters vanish without splitting the word; Zs and tab/newline split it.
    assert uncased.tokenize("un\x00want\u200bed\ufffd") == ["un", "##want", "##ed"]
    assert uncased.tokenize("low\u00a0lowest\u3000low\u2028want") == ["low", "lowest", "low", "want"]


def test_words_over_100_characters_are_unknown():
    tok = WordPieceTokenizer([*SPECIAL_TOKENS, "a", "##a"])
    assert tok.tokenize("a" * 100) == ["a"] + ["##a"] * 99
    assert tok.tokenize("a" * 101) == ["[UNK]"]


def test_single_and_pair_layout(uncased):
    enc = uncased.encode("unwanted", "running low")
    assert enc.tokens == ["[CLS]", "un", "##want", "##ed", "[SEP]", "runn", "##ing", "low", "[SEP]"]
    assert enc.input_ids[0] == uncased.cls_token_id and enc.input_ids[4] == uncased.sep_token_id
    assert enc.token_type_ids == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert enc.attention_mask == [1] * 9
    assert enc.sequence_ids == [None, 0, 0, 0, None, 1, 1, 1, None]
    assert enc.word_ids == [None, 0, 0, 0, None, 0, 0, 1, None]
    assert enc.offsets == [(0, 0), (0, 2), (2, 6), (6, 8), (0, 0), (0, 4), (4, 7), (8, 11), (0, 0)]
    assert len(enc) == 9


def test_truncation_longest_first(uncased):
    enc = uncased.encode("unwanted running", "low", max_length=6)
    assert enc.tokens == ["[CLS]", "un", "##want", "[SEP]", "low", "[SEP]"]
    assert uncased.encode("unwanted running", max_length=4).tokens == ["[CLS]", "un", "##want", "[SEP]"]
    assert len(uncased.encode("unwanted running", truncation=False, max_length=4)) == 7
    with pytest.raises(BertkitError, match="max_length"):
        uncased.encode("a", "b", max_length=2)


def test_offsets_point_into_original_accented_text(uncased):
    text = "UNWÄNTED, Runñing"
    enc = uncased.encode(text)
    spans = [text[a:b] for (a, b), s in zip(enc.offsets, enc.sequence_ids) if s is not None]
    assert spans == ["UN", "WÄNT", "ED", ",", "Runñ", "ing"]


def test_decode_merges_continuations(uncased):
    ids = uncased.encode("unwanted, running").input_ids
    assert uncased.decode(ids) == "unwanted , running"
    assert uncased.decode(ids, skip_special_tokens=False).startswith("[CLS] unwanted")
    with pytest.raises(BertkitError, match="outside this vocabulary"):
        uncased.decode([len(GOOGLE_TEST_VOCAB)])


def test_batch_matches_single(uncased):
    texts = ["unwanted", "running, low", "", "lowest want"]
    batch = uncased.encode_batch(texts, texts[::-1], max_length=7)
    singles = [uncased.encode(a, b, max_length=7).input_ids for a, b in zip(texts, texts[::-1])]
    assert [e.input_ids for e in batch] == singles
    assert uncased.encode_ids(texts) == [uncased.convert_tokens_to_ids(uncased.tokenize(t)) for t in texts]


def test_properties(uncased):
    assert uncased.vocab_size == len(GOOGLE_TEST_VOCAB) == len(uncased)
    assert (uncased.pad_token_id, uncased.unk_token_id, uncased.cls_token_id, uncased.sep_token_id,
            uncased.mask_token_id) == (0, 1, 2, 3, 4)
    assert uncased.special_token_ids == (0, 1, 2, 3, 4)
    assert uncased.vocab["runn"] == 10
    assert uncased.convert_ids_to_tokens([9, 6]) == ["un", "##want"]
    assert len(uncased.vocab_hash) == 64


def test_save_and_load_round_trip(tmp_path, uncased):
    cased = WordPieceTokenizer(GOOGLE_TEST_VOCAB, do_lower_case=False)
    cased.save_pretrained(tmp_path)
    assert (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines() == GOOGLE_TEST_VOCAB
    loaded = WordPieceTokenizer.from_pretrained(tmp_path)
    assert loaded.do_lower_case is False and loaded.vocab_hash == cased.vocab_hash
    assert WordPieceTokenizer.from_pretrained(tmp_path / "vocab.txt", do_lower_case=True).do_lower_case


def test_loading_keeps_file_ids_and_rejects_bad_vocabularies(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("hello\r\n[PAD]\n  [UNK] \n[CLS]\n[SEP]\n[MASK]\n", encoding="utf-8")
    tok = WordPieceTokenizer.from_pretrained(vocab)
    assert tok.vocab == {"hello": 0, "[PAD]": 1, "[UNK]": 2, "[CLS]": 3, "[SEP]": 4, "[MASK]": 5}
    vocab.write_text("[PAD]\n[UNK]\n\n[CLS]\n[SEP]\n[MASK]\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="vocab.txt:3: empty"):
        WordPieceTokenizer.from_pretrained(vocab)
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n[UNK]\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="vocab.txt:6: duplicate token '\\[UNK\\]' \\(also on line 2\\)"):
        WordPieceTokenizer.from_pretrained(vocab)
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="lacks \\[MASK\\]"):
        WordPieceTokenizer.from_pretrained(vocab)
    vocab.write_bytes(b"[PAD]\n\xff\n")
    with pytest.raises(BertkitError, match="vocab.txt:2: vocabulary is not valid UTF-8"):
        WordPieceTokenizer.from_pretrained(vocab)
    with pytest.raises(BertkitError, match="missing does not exist"):
        WordPieceTokenizer.from_pretrained(tmp_path / "missing")


def test_train_specials_first_and_encodes_corpus(tmp_path):
    lines = ["the quick brown fox jumps over the lazy dog", "The dog sleeps; the fox runs!"] * 50
    plain = tmp_path / "a.txt"
    plain.write_text("\n".join(lines), encoding="utf-8")
    packed = tmp_path / "b.txt.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as handle:
        handle.write("jumping foxes and sleeping dogs\n" * 20)
    tok = WordPieceTokenizer.train([plain, packed], vocab_size=120, min_frequency=2, show_progress=False)
    assert [tok.convert_ids_to_tokens(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert tok.vocab_size <= 120 and "fox" in tok.vocab and "##s" in tok.vocab
    assert "[UNK]" not in tok.tokenize("The quick fox jumps; dogs sleeping")


def test_train_says_when_the_corpus_gives_fewer_tokens_than_the_vocab_size(tmp_path, caplog):
    text = tmp_path / "a.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20, encoding="utf-8")
    with caplog.at_level("WARNING"):
        tok = WordPieceTokenizer.train([text], vocab_size=5000, min_frequency=2, show_progress=False)
    assert tok.vocab_size < 5000
    assert f"the vocabulary has {tok.vocab_size:,} tokens, fewer than --vocab-size 5,000" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        WordPieceTokenizer.train([text], vocab_size=40, min_frequency=2, show_progress=False)
    assert "fewer than --vocab-size" not in caplog.text


def test_train_rejects_missing_and_empty_files(tmp_path):
    with pytest.raises(BertkitError, match="none.txt: file not found"):
        WordPieceTokenizer.train([tmp_path / "none.txt"])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \x00\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="no text found"):
        WordPieceTokenizer.train([empty], show_progress=False)



@pytest.mark.parametrize("vocab_size, limit_alphabet", [(6, 1000), (30, 0)])
def test_train_says_when_the_sizes_leave_no_room_not_that_the_text_is_missing(tmp_path, vocab_size, limit_alphabet):
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat\n" * 5, encoding="utf-8")
    with pytest.raises(BertkitError, match=f"--vocab-size {vocab_size} with --limit-alphabet {limit_alphabet} leaves "
                                           "no room"):
        WordPieceTokenizer.train([text], vocab_size=vocab_size, limit_alphabet=limit_alphabet, show_progress=False)


def test_cli_train_and_encode(tmp_path, capsys):
    corpus = [tmp_path / f"{i}.txt" for i in range(2)]
    for path in corpus:
        path.write_text("Hello world, hello tokenizer.\n" * 30, encoding="utf-8")
    out = tmp_path / "vocab"
    args = ["tokenizer", "train", "--input", *map(str, corpus), "--vocab-size", "60", "--output", str(out),
            "--cased", "--no-progress"]
    assert main(args) == 0
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert main(["tokenizer", "encode", "--tokenizer", str(out), "Hello world"]) == 0
    assert "Hello" in capsys.readouterr().out
    assert main(["tokenizer", "train", "--output", str(out)]) == 2
    assert "no input files" in capsys.readouterr().err


def test_saved_directory_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = WordPieceTokenizer(GOOGLE_TEST_VOCAB, do_lower_case=False)
    ours.save_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "UNwant runn, want"
    assert theirs(text)["input_ids"] == ours.encode(text).input_ids


def _hf_tokenizer_directory(directory, do_lower_case: bool, keep_config: bool):
    """What transformers 5 saves for a BERT tokenizer: tokenizer.json (+ tokenizer_config.json), no vocab.txt."""
    transformers = pytest.importorskip("transformers")
    vocab = directory / "source-vocab.txt"
    vocab.write_text("".join(t + "\n" for t in GOOGLE_TEST_VOCAB), encoding="utf-8")
    fast = transformers.BertTokenizerFast(vocab=str(vocab), do_lower_case=do_lower_case)
    saved = directory / "hf"
    fast.save_pretrained(saved)
    (saved / "vocab.txt").unlink(missing_ok=True)
    if not keep_config:
        (saved / "tokenizer_config.json").unlink()
    return saved, fast


@pytest.mark.parametrize("do_lower_case", [True, False], ids=["uncased", "cased"])
@pytest.mark.parametrize("keep_config", [True, False], ids=["with-config", "json-only"])
def test_loads_a_hugging_face_tokenizer_json_without_vocab_txt(tmp_path, do_lower_case, keep_config):
    saved, fast = _hf_tokenizer_directory(tmp_path, do_lower_case, keep_config)
    for path in (saved, saved / "tokenizer.json"):
        tok = WordPieceTokenizer.from_pretrained(path)
        assert tok.do_lower_case is do_lower_case  # from tokenizer_config.json, else the normalizer
        assert tok.convert_ids_to_tokens(list(range(tok.vocab_size))) == GOOGLE_TEST_VOCAB
        text = "UNwant running, Lowest"
        assert tok.encode(text).input_ids == fast(text)["input_ids"]


def test_tokenizer_config_overrides_the_tokenizer_json_normalizer(tmp_path):
    saved, _ = _hf_tokenizer_directory(tmp_path, do_lower_case=True, keep_config=False)
    (saved / "tokenizer_config.json").write_text('{"do_lower_case": false}', encoding="utf-8")
    assert WordPieceTokenizer.from_pretrained(saved).do_lower_case is False


def test_refuses_a_tokenizer_json_that_is_not_wordpiece(tmp_path):
    saved, _ = _hf_tokenizer_directory(tmp_path, do_lower_case=True, keep_config=True)
    spec = json.loads((saved / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"] = {"type": "BPE", "vocab": spec["model"]["vocab"], "merges": []}
    (saved / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(BertkitError, match="model is 'BPE'.*only WordPiece"):
        WordPieceTokenizer.from_pretrained(saved)
    (saved / "tokenizer.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(BertkitError, match="tokenizer.json: not a JSON object"):
        WordPieceTokenizer.from_pretrained(saved)


def test_missing_and_empty_tokenizer_directories_say_so(tmp_path):
    with pytest.raises(BertkitError, match="nowhere does not exist"):
        WordPieceTokenizer.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(BertkitError, match="holds neither vocab.txt nor tokenizer.json"):
        WordPieceTokenizer.from_pretrained(tmp_path)
