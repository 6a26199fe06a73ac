"""Every input length is declared by one rule (`sequence_length_field`) and checked against a model's position
table by one function (`check_positions`), issue 47 item 5."""

from __future__ import annotations

import dataclasses

import click
import pytest

from bertkit.cli.options import settings_options
from bertkit.errors import BertkitError
from bertkit.settings import InstanceSettings, TokenizerEncodeSettings
from bertkit.settings.fields import PAIR_TOKENS, SINGLE_TEXT_TOKENS, Settings, check_positions, sequence_length_field


@dataclasses.dataclass(frozen=True)
class Lengths(Settings):
    """A command with one length of each kind."""

    single: int = sequence_length_field(128)
    """Longest single text."""
    pair: int | None = sequence_length_field(None, pairs=True, most=1000)
    """Longest pair."""


def test_the_least_length_is_the_specials_and_a_token_of_each_text():
    assert (SINGLE_TEXT_TOKENS, PAIR_TOKENS) == (3, 5)  # [CLS] x [SEP]; [CLS] a [SEP] b [SEP]
    assert Lengths(single=3, pair=5) == Lengths(3, 5) and Lengths().pair is None
    with pytest.raises(BertkitError, match=r"--single must be >= 3, got 2"):
        Lengths(single=2)
    with pytest.raises(BertkitError, match=r"--pair must be in \[5, 1000\], got 1001"):
        Lengths(pair=1001)
    with pytest.raises(BertkitError, match=r"--max-seq-length must be in \[5, 65535\], got 4"):
        InstanceSettings(max_seq_length=4)  # NSP pairs; the shards' uint16 positions
    with pytest.raises(BertkitError, match=r"--max-length must be >= 3, got 2"):
        TokenizerEncodeSettings(tokenizer="t", max_length=2)


def test_the_command_line_takes_the_same_bounds():
    @click.command()
    @settings_options(Lengths)
    def command(**flags):
        pass

    ranges = {p.name: (p.type.min, p.type.max) for p in command.params if isinstance(p.type, click.IntRange)}
    assert ranges == {"single": (3, None), "pair": (5, 1000)}


def test_a_length_past_the_position_table_is_one_error_naming_the_flag():
    check_positions(512, 512)
    with pytest.raises(BertkitError, match=r"^--max-seq-length 513 exceeds the model's max_position_embeddings "
                                           r"\(512\); use --max-seq-length 512 or less$"):
        check_positions(513, 512)
    with pytest.raises(BertkitError, match=r"^--max-length 200 exceeds .* use --max-length 128 or less$"):
        check_positions(200, 128, "--max-length")
