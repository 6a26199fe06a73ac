"""Tokenizer settings transformers saves that bertkit's tokenizer does not follow are refused in one line, never
read into other token ids: accents kept while lower-casing (or stripped while keeping case), CJK characters not
split, tokens added beside vocab.txt (read as [UNK])."""

from __future__ import annotations

import json

import pytest
import transformers

from bertkit.errors import BertkitError
from bertkit.tokenizer import WordPieceTokenizer

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cafe", "café", "the", "東", "京", "東京"]


def _saved(tmp_path, **options):
    (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    transformers.BertTokenizer(str(tmp_path / "vocab.txt"), **options).save_pretrained(tmp_path / "saved")
    return tmp_path / "saved"


@pytest.mark.parametrize("options, said", [
    ({"strip_accents": False}, "strip_accents false with do_lower_case true"),
    ({"do_lower_case": False, "strip_accents": True}, "strip_accents true with do_lower_case false"),
    ({"tokenize_chinese_chars": False}, "tokenize_chinese_chars false")])
def test_other_accent_and_cjk_rules_are_refused(tmp_path, options, said):
    with pytest.raises(BertkitError, match=said):
        WordPieceTokenizer.from_pretrained(_saved(tmp_path, **options))


@pytest.mark.parametrize("options", [{}, {"do_lower_case": False}, {"strip_accents": True}])
def test_googles_rules_load_and_give_transformers_ids(tmp_path, options):
    directory = _saved(tmp_path, **options)
    ours, theirs = WordPieceTokenizer.from_pretrained(directory), transformers.BertTokenizer.from_pretrained(directory)
    for text in ("the café", "東京 the CAFE"):
        assert ours.encode(text).input_ids == theirs(text)["input_ids"]


@pytest.mark.parametrize("layout", ["added_tokens.json", "added_tokens_decoder"])
def test_tokens_added_beside_vocab_txt_are_refused_not_read_as_unk(tmp_path, layout):
    """transformers 4 kept added tokens beside vocab.txt (added_tokens.json, then tokenizer_config.json's
    added_tokens_decoder); bertkit read 'covid' as [UNK], quietly (tokenizer.json's were refused already)."""
    (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    WordPieceTokenizer.from_pretrained(tmp_path)
    if layout == "added_tokens.json":
        (tmp_path / "added_tokens.json").write_text(json.dumps({"covid": len(WORDS)}))
    else:
        special = {str(i): {"content": token, "special": True} for i, token in enumerate(WORDS[:5])}
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({
            "do_lower_case": True, "added_tokens_decoder": {**special, str(len(WORDS)): {"content": "covid"}}}))
    with pytest.raises(BertkitError, match=r"added tokens \['covid'\] .* would be read as \[UNK\]"):
        WordPieceTokenizer.from_pretrained(tmp_path)
