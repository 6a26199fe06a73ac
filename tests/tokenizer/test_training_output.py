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
