"""`bertkit tokenizer extend`: a model's vocabulary grows by the domain pieces that save the most tokens, every
old id keeps its token and its rows, the model gives the same outputs on old-vocabulary text (bertkit and
transformers), a sentence-transformers directory stays one, and bad input is one line of error.

Tiny: a bert-debug model over a 120-token vocabulary trained on the toy corpus, and a domain corpus of
compound words that vocabulary splits into several pieces.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import transformers

from bertkit.cli import main
from bertkit.config import preset
from bertkit.model import BertForMaskedLM
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.tokenizer.extend import wordpiece
from bertkit.workflows.adapt import REPORT_FILE

DOMAIN_WORDS = ("millstones", "riverbank", "grainbook", "stonemills", "bookkeeper", "millrace")


def write_domain_corpus(path: Path, lines: int = 60) -> Path:
    rng = random.Random(1)
    words = (*DOMAIN_WORDS, "the", "miller", "and", "his", "grain")
    path.write_text("".join(" ".join(rng.choice(words) for _ in range(8)).capitalize() + ".\n" for _ in range(lines)),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory, write_toy_corpus) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("extend")
    corpus = write_toy_corpus(root / "corpus.txt", documents=40, sentences=(2, 8), words=(4, 14))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=120, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    model = BertForMaskedLM(preset("bert-debug", vocab_size=tokenizer.vocab_size))
    torch.nn.init.normal_(model.mlm.bias, std=0.5)  # a trained-looking bias, so its new entries mean something
    model.save_pretrained(root / "model", tokenizer=tokenizer)
    return {"root": root, "model": root / "model", "domain": write_domain_corpus(root / "domain.txt"),
            "tokenizer": root / "model"}


def extend(base, output: Path, *extra: str) -> int:
    return main(["tokenizer", "extend", "--model", str(base["model"]), "--corpus", str(base["domain"]),
                 "--output", str(output), *extra])


@pytest.fixture(scope="module")
def extended(base) -> Path:
    output = base["root"] / "extended"
    assert extend(base, output, "--add", "5") == 0
    return output


def test_old_ids_are_unchanged_and_new_pieces_are_appended(base, extended):
    old = (base["model"] / "vocab.txt").read_text().splitlines()
    new = (extended / "vocab.txt").read_text().splitlines()
    assert new[: len(old)] == old and len(new) == len(old) + 5
    config = json.loads((extended / "config.json").read_text())
    assert config["vocab_size"] == len(new)
    report = json.loads((extended / REPORT_FILE).read_text())
    assert [p["token"] for p in report["pieces"]] == new[len(old):]
    assert report["first_new_id"] == len(old) and report["added"] == 5


def test_the_tokenizer_uses_the_new_pieces_and_words_get_shorter(base, extended):
    old = WordPieceTokenizer.from_pretrained(base["model"])
    new = WordPieceTokenizer.from_pretrained(extended)
    added = set(new.vocab) - set(old.vocab)
    text = base["domain"].read_text()
    assert added & set(new.tokenize(text))
    assert len(new.tokenize(text)) < len(old.tokenize(text))
    report = json.loads((extended / REPORT_FILE).read_text())
    words = report["words"]
    assert report["tokens_before"] == len(old.tokenize(text))
    assert report["tokens_after"] == len(new.tokenize(text))
    assert report["tokens_per_word_after"] == pytest.approx(len(new.tokenize(text)) / words, abs=1e-4)
    assert report["tokens_per_word_after"] < report["tokens_per_word_before"]
    # The Rust tokenizer and the greedy WordPiece the ranking uses agree on every domain word.
    for word in set(text.lower().replace(".", " ").split()):
        assert new.tokenize(word) == wordpiece(word, new.vocab)


def test_the_cli_prints_tokens_per_word(base, tmp_path, capsys):
    assert extend(base, tmp_path / "out", "--add", "2") == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert f"tokens per word on the corpus: {report['tokens_per_word_before']:.3f} -> " \
           f"{report['tokens_per_word_after']:.3f}" in out


def test_pieces_are_chosen_by_tokens_saved_and_their_savings_add_up(base, extended):
    report = json.loads((extended / REPORT_FILE).read_text())
    saved = [p["saved"] for p in report["pieces"]]
    assert saved == sorted(saved, reverse=True) and saved[-1] > 0
    assert sum(saved) == report["tokens_before"] - report["tokens_after"]
    # The first piece is the one that saves the most of all candidates, alone.
    old = WordPieceTokenizer.from_pretrained(base["model"])
    text = base["domain"].read_text()
    best = report["pieces"][0]
    extended_once = WordPieceTokenizer([*sorted(old.vocab, key=old.vocab.__getitem__), best["token"]])
    assert len(old.tokenize(text)) - len(extended_once.tokenize(text)) == best["saved"]


def old_vocabulary_batch(vocab_size: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(5, vocab_size, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}


def test_the_resized_model_equals_the_original_on_old_vocabulary_text(base, extended):
    vocab_size = WordPieceTokenizer.from_pretrained(base["model"]).vocab_size
    batch = old_vocabulary_batch(vocab_size)
    real = batch["attention_mask"].bool()
    for load in (BertForMaskedLM.from_pretrained, transformers.BertForMaskedLM.from_pretrained):
        before, after = load(base["model"]).eval(), load(extended).eval()
        with torch.no_grad():
            a, b = before(**batch).logits, after(**batch).logits
        assert b.shape[-1] == vocab_size + 5
        torch.testing.assert_close(b[..., :vocab_size][real], a[real], rtol=0, atol=1e-6)
    bare_before = transformers.BertModel.from_pretrained(base["model"]).eval()
    bare_after = transformers.BertModel.from_pretrained(extended).eval()
    with torch.no_grad():
        torch.testing.assert_close(bare_after(**batch).last_hidden_state[real],
                                   bare_before(**batch).last_hidden_state[real], rtol=0, atol=1e-6)


def test_new_rows_are_the_mean_of_their_old_pieces(base, extended):
    old_tokenizer = WordPieceTokenizer.from_pretrained(base["model"])
    before, after = BertForMaskedLM.from_pretrained(base["model"]), BertForMaskedLM.from_pretrained(extended)
    old_rows, new_rows = before.bert.embeddings.word.weight, after.bert.embeddings.word.weight
    for token, i in WordPieceTokenizer.from_pretrained(extended).vocab.items():
        if i < old_tokenizer.vocab_size:
            continue
        pieces = wordpiece(token, old_tokenizer.vocab)
        assert pieces is not None and len(pieces) > 1
        ids = [old_tokenizer.vocab[p] for p in pieces]
        torch.testing.assert_close(new_rows[i], old_rows[ids].mean(0))
        torch.testing.assert_close(after.mlm.bias[i], before.mlm.bias[ids].mean())


def test_random_init_draws_rows_like_the_paper(base, extended, tmp_path):
    assert extend(base, tmp_path / "random", "--add", "5", "--init", "random") == 0
    mean, rand = BertForMaskedLM.from_pretrained(extended), BertForMaskedLM.from_pretrained(tmp_path / "random")
    first = json.loads((extended / REPORT_FILE).read_text())["first_new_id"]
    new_rows = rand.bert.embeddings.word.weight[first:]
    assert not torch.allclose(new_rows, mean.bert.embeddings.word.weight[first:])
    assert 0.01 < new_rows.std().item() < 0.03 and torch.all(rand.mlm.bias[first:] == 0)
    torch.testing.assert_close(rand.bert.embeddings.word.weight[:first], mean.bert.embeddings.word.weight[:first])


def test_a_sentence_transformers_directory_stays_one(base, tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    transformer = Transformer(str(base["model"]))
    pooling = Pooling(transformer.get_embedding_dimension(), "mean")
    original = SentenceTransformer(modules=[transformer, pooling, Normalize()], device="cpu")
    original.save(str(tmp_path / "st"))
    main_args = ["tokenizer", "extend", "--model", str(tmp_path / "st"), "--corpus", str(base["domain"]),
                 "--output", str(tmp_path / "st-extended"), "--add", "3"]
    assert main(main_args) == 0
    assert (tmp_path / "st-extended" / "modules.json").is_file()
    extended = SentenceTransformer(str(tmp_path / "st-extended"), device="cpu")
    reloaded = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    old_text = ["the miller kept his grain", "a small book of accounts"]
    torch.testing.assert_close(extended.encode(old_text, convert_to_tensor=True),
                               reloaded.encode(old_text, convert_to_tensor=True), rtol=0, atol=1e-6)
    new = set(json.loads((tmp_path / "st-extended" / REPORT_FILE).read_text())["pieces"][0]["token"].split())
    assert new & set(extended.tokenizer.tokenize(base["domain"].read_text()))


def one_line_error(capsys, code: int) -> str:
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bertkit: error:")
    return err


def test_a_non_bert_directory_is_one_line(base, tmp_path, capsys):
    other = tmp_path / "gpt"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    (other / "vocab.txt").write_text((base["model"] / "vocab.txt").read_text())
    code = main(["tokenizer", "extend", "--model", str(other), "--corpus", str(base["domain"]),
                 "--output", str(tmp_path / "o"), "--add", "2"])
    assert "not a BERT directory" in one_line_error(capsys, code)
    (other / "config.json").unlink()
    code = main(["tokenizer", "extend", "--model", str(other), "--corpus", str(base["domain"]),
                 "--output", str(tmp_path / "o"), "--add", "2"])
    assert "no config.json" in one_line_error(capsys, code)


def test_more_pieces_than_possible_is_one_line(base, tmp_path, capsys):
    err = one_line_error(capsys, extend(base, tmp_path / "o", "--add", "100000"))
    assert "--add 100000: only" in err and "use --add" in err
    assert not (tmp_path / "o").exists()


def test_a_corpus_with_no_new_words_is_one_line(base, tmp_path, capsys):
    tokenizer = WordPieceTokenizer.from_pretrained(base["model"])
    whole = [w for w in tokenizer.vocab if w.isalpha() and len(w) > 1]  # words that are one piece
    plain = tmp_path / "plain.txt"
    plain.write_text((" ".join(whole) + ".\n") * 20)
    code = main(["tokenizer", "extend", "--model", str(base["model"]), "--corpus", str(plain),
                 "--output", str(tmp_path / "o"), "--add", "2"])
    assert "no new words" in one_line_error(capsys, code)


def test_an_existing_output_is_refused(base, extended, capsys):
    assert "already holds files" in one_line_error(capsys, extend(base, extended, "--add", "1"))
