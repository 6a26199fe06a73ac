"""SQuAD windows, answer-to-token mapping and n-best post-processing; tagging's first-sub-token labels."""

from __future__ import annotations

import numpy as np
import pytest

from bertkit.data.conll import TaggedSentence
from bertkit.data.squad import SquadExample
from bertkit.tasks.squad import SquadSettings, SquadTask
from bertkit.tasks.tagging import IGNORE_INDEX, TaggingSettings, TaggingTask
from bertkit.tasks.windows import max_context_flags, sliding_windows
from bertkit.tokenizer import WordPieceTokenizer


@pytest.fixture(scope="module")
def tokenizer() -> WordPieceTokenizer:
    words = "the capital of france is paris where who what a b c d e f g h".split()
    return WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words,
                               "?", ".", "un", "##believ", "##able"])


def test_sliding_windows_follow_the_doc_stride_rule() -> None:
    assert sliding_windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert sliding_windows(3, 4, 2) == [(0, 3)]
    assert sliding_windows(0, 4, 2) == [(0, 0)]


def test_max_context_prefers_the_window_where_the_token_is_most_central() -> None:
    spans = sliding_windows(10, 4, 3)  # windows 0-3, 3-6, 6-9
    flags = max_context_flags(spans)
    owner = {start + i: w for w, (start, size) in enumerate(spans) for i in range(size) if flags[w][i]}
    assert sorted(owner) == list(range(10))  # every token owned by exactly one window
    # Token 3 scores min(3, 0) in window 0 and min(0, 3) in window 1: a tie goes to the first window.
    assert owner[3] == 0 and owner[6] == 1 and owner[4] == 1 and owner[9] == 2
    spans = sliding_windows(9, 5, 2)  # windows 0-4, 2-6, 4-8: token 4 is central only in the middle one
    assert [flags[4 - start] for flags, (start, _) in zip(max_context_flags(spans), spans)] == [False, True, False]


def test_answer_characters_map_to_tokens_in_every_window(tokenizer: WordPieceTokenizer) -> None:
    context = "what is the capital of france ? paris is the capital of france ."
    start = context.index("paris")
    example = SquadExample("q", "where is paris ?", context, (("paris", start),), False)
    task = SquadTask(SquadSettings(max_seq_length=16, doc_stride=4, max_query_length=8))
    features = task.features([example], tokenizer, training=True)
    assert len(features) > 1
    found = 0
    for feature in features:
        s, e = feature["start_positions"], feature["end_positions"]
        if s == 0:
            assert e == 0  # answer outside this window -> [CLS]
            continue
        found += 1
        assert context[feature["word_spans"][s][0]:feature["word_spans"][e][1]] == "paris"
        assert tokenizer.convert_ids_to_tokens(feature["input_ids"][s]) == "paris"
    assert found >= 1
    assert all(f["input_ids"][0] == tokenizer.cls_token_id and f["token_type_ids"][-1] == 1 for f in features)


def test_sub_token_answer_boundaries_are_exact(tokenizer: WordPieceTokenizer) -> None:
    context = "paris is unbelievable"
    example = SquadExample("q", "what", context, (("unbeliev", 9),), False)
    [feature] = SquadTask(SquadSettings(max_seq_length=32)).features([example], tokenizer, training=True)
    tokens = tokenizer.convert_ids_to_tokens(feature["input_ids"])
    assert tokens[feature["start_positions"]:feature["end_positions"] + 1] == ["un", "##believ"]


def _logits(length: int, peaks: dict[int, float]) -> np.ndarray:
    values = np.full(length, -10.0)
    for index, value in peaks.items():
        values[index] = value
    return values


def test_nbest_respects_max_context_length_order_and_null(tokenizer: WordPieceTokenizer) -> None:
    context = "paris is the capital of france"
    example = SquadExample("q", "where", context, (), True)
    task = SquadTask(SquadSettings(max_seq_length=32, version_2_with_negative=True, max_answer_length=2))
    [feature] = task.features([example], tokenizer)
    n = len(feature["input_ids"])
    first = feature["word_spans"].index((0, 5))  # "paris"
    last = feature["word_spans"].index((24, 30))  # "france"
    # Best raw pair (start=paris, end=france) is 6 tokens long: excluded by max_answer_length 2.
    start = _logits(n, {first: 5.0, last: 3.0, 0: 1.0})
    end = _logits(n, {last: 5.0, first: 2.0, 0: 1.0})
    decoded = task.decode([example], [feature], {"start_logits": [start], "end_logits": [end]})
    texts = [entry["text"] for entry in decoded["nbest"]["q"]]
    assert texts[0] == "france" and "paris" in texts and "" in texts  # france 3+5=8, paris 5+2=7, null 2
    assert "paris is the capital of france" not in texts
    assert decoded["null_odds"]["q"] == pytest.approx(2.0 - 8.0)
    assert decoded["predictions"]["q"] == "france"  # null_odds -6 <= threshold 0
    assert sum(e["probability"] for e in decoded["nbest"]["q"]) == pytest.approx(1.0)
    task.settings.null_score_diff_threshold = -7.0
    assert task.decode([example], [feature], {"start_logits": [start], "end_logits": [end]})["predictions"]["q"] == ""


def test_tagging_labels_only_first_sub_tokens(tokenizer: WordPieceTokenizer) -> None:
    sentence = TaggedSentence(["paris", "unbelievable", "france"], ["B-LOC", "O", "B-LOC"], "f:1")
    task = TaggingTask(TaggingSettings(labels=["O", "B-LOC"], max_seq_length=32))
    [feature] = task.features([sentence], tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(feature["input_ids"])
    assert tokens == ["[CLS]", "paris", "un", "##believ", "##able", "france", "[SEP]"]
    assert feature["labels"] == [IGNORE_INDEX, 1, 0, IGNORE_INDEX, IGNORE_INDEX, 1, IGNORE_INDEX]
    logits = np.zeros((7, 2))
    logits[[1, 5], 1] = 1.0  # B-LOC at paris and france
    logits[3, 1] = 5.0  # a continuation piece's score is never used
    assert task.decode([sentence], [feature], {"logits": [logits]}) == [["B-LOC", "O", "B-LOC"]]
