"""A log line written during training (the head warm-up's end, a resume note) starts a line of its own: the
progress bar is cleared and redrawn around it, instead of the message being glued after the bar's text."""

from __future__ import annotations

import logging
import re
import sys

from toy_training import toy_data, toy_loss, toy_model

from bertkit.train import TrainConfig, fit

MESSAGE = "a message logged while the bar is drawn"


def test_a_log_line_is_not_glued_to_the_progress_bar(tmp_path, capsys):
    handler = logging.StreamHandler(sys.stderr)  # on the root logger, as logging.basicConfig in the commands
    logging.getLogger().addHandler(handler)
    calls = {"n": 0}

    def loss_logging_at_step_3(model, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            logging.getLogger("bertkit.test_log_lines").warning(MESSAGE)
        return toy_loss(model, batch)
    try:
        fit(toy_model(), loss_logging_at_step_3, toy_data(), TrainConfig(max_steps=5, micro_batch_size=4,
                                                                         learning_rate=1e-3, precision="fp32",
                                                                         log_every=1), tmp_path)
    finally:
        logging.getLogger().removeHandler(handler)
    pieces = re.split(r"[\r\n]", capsys.readouterr().err)
    assert any(piece.startswith("train:") for piece in pieces)  # the bar was drawn
    assert [piece for piece in pieces if MESSAGE in piece] == [MESSAGE]
