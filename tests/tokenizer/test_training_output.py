"""What `bertkit tokenizer train` prints where its stdout is not a terminal (a log file, a pipe): its own lines
only. The tokenizers library's progress bars wrote bare line breaks there (issue 51's tour: three blank lines
before "wrote ...")."""

from __future__ import annotations

from bertkit.cli import main


def test_a_redirected_stdout_gets_no_blank_lines(tmp_path, capfd):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog ran\n\nanother document here\n", encoding="utf-8")
    assert main(["tokenizer", "train", "--input", str(corpus), "--output", str(tmp_path / "vocab"),
                 "--vocab-size", "60"]) == 0
    out = capfd.readouterr().out
    assert out.startswith("wrote ") and "\n\n" not in out


def test_an_existing_vocabulary_is_replaced_only_with_overwrite(tmp_path, capfd):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog ran\n\nanother document here\n", encoding="utf-8")
    train = ["tokenizer", "train", "--input", str(corpus), "--output", str(tmp_path / "vocab"), "--vocab-size"]
    assert main([*train, "60"]) == 0
    kept = (tmp_path / "vocab" / "vocab.txt").read_bytes()
    assert main([*train, "40"]) == 2
    err = capfd.readouterr().err
    assert "already holds a vocabulary (vocab.txt)" in err and "pass --overwrite" in err
    assert (tmp_path / "vocab" / "vocab.txt").read_bytes() == kept  # untouched
    corpus.write_text("quick brown foxes jump over lazy dogs\n", encoding="utf-8")
    assert main([*train, "40", "--overwrite"]) == 0
    assert (tmp_path / "vocab" / "vocab.txt").read_bytes() != kept
