"""Token-tagging data as tables: one sentence per row, its tokens in one column and its tags in another.

Formats: JSONL (also .gz/.zst, or a JSON array of objects: `bertkit.io.textfile.read_json_rows`),
Parquet files and `datasets` save_to_disk directories (`bertkit.io.columnar`). The layout is Hugging Face
conll2003's: a `tokens` column (a list of strings) and a `ner_tags` column (a list of tags, one per token);
`--tokens-column` / `--tags-column` name others. A tag is a string (B-PER), or an integer of a column that
`datasets` declared a list of `ClassLabel` (conll2003's ner_tags), read as its name, so a model fine-tuned
on the `datasets` copy has the labels of one fine-tuned on the CoNLL text. Integers without names are
refused: a tagging model's labels are tags of its scheme, never numbers. An "id" column, when there is
one, names each row in the predictions.

Design decision: a row becomes the `TaggedSentence` that `read_conll` makes of a sentence (at "file:row",
rows from 1; "file:line" in JSONL), so the task sees one shape whatever the format. What is wrong with one
row (a null or missing value, no tokens, tokens and tags of different lengths) skips it, returned as
"file:row: reason" for the caller to count and name; what is wrong with the column (absent, not lists,
items that are not strings, integer tags without names, a tag outside the tagging scheme) is an error
naming the file, the row and the flag, since then every row is read wrong.

Reference: the conll2003 dataset of the Hugging Face Hub (features tokens, ner_tags: a list of ClassLabel).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertkit.data.conll import TaggedSentence, is_scheme_tag, scheme_tags
from bertkit.errors import BertkitError, where
from bertkit.io.columnar import check_columns, column_names, is_table_input, read_rows
from bertkit.io.textfile import check_length, format_suffix, read_json_rows

TOKENS_FLAG = "--tokens-column"
TAGS_FLAG = "--tags-column"


def is_tag_table(path: str | Path) -> bool:
    """Whether a tagging input is a table (JSON rows, Parquet, a `datasets` directory) rather than CoNLL text."""
    path = Path(path)
    return is_table_input(path) or format_suffix(path) in (".jsonl", ".json")


def read_tag_table(path: str | Path, tokens_column: str, tags_column: str | None, scheme: str | None = None,
                   ) -> tuple[list[TaggedSentence], list[str]]:
    """The sentences of a tagging table and the rows skipped ("file:row: reason"); `tags_column` None reads
    no tags (`bertkit predict`); with a `scheme` (BIO, IOB1, BIOES) every tag must be one of its tags."""
    path = Path(path)
    rows = _columnar_rows(path, tokens_column, tags_column) if is_table_input(path) else \
        _json_rows(path, tokens_column, tags_column)
    sentences: list[TaggedSentence] = []
    skipped: list[str] = []
    for number, row in rows:
        sentence = _sentence(where(path, number), row, tokens_column, tags_column, scheme)
        if isinstance(sentence, str):
            skipped.append(f"{where(path, number)}: {sentence}")
        else:
            sentences.append(sentence)
    if not sentences:
        reason = f"; all {len(skipped)} rows were skipped, first: {skipped[0]}" if skipped else ""
        raise BertkitError(f"{path}: no sentences{reason}")
    return sentences, skipped


def _columnar_rows(path: Path, tokens_column: str, tags_column: str | None) -> list[tuple[int, dict[str, Any]]]:
    wanted = {tokens_column: TOKENS_FLAG}
    lists = {tokens_column: False}  # column -> whether its items may be integers (ClassLabel ids)
    if tags_column is not None:
        wanted[tags_column], lists[tags_column] = TAGS_FLAG, True
    if "id" in column_names(path):
        wanted.setdefault("id", "the row's id")
    return read_rows(path, wanted, list_columns=lists)


def _json_rows(path: Path, tokens_column: str, tags_column: str | None) -> list[tuple[int, dict[str, Any]]]:
    """The objects of a JSONL file (or JSON array); the first object must have the columns' keys (a later
    object without one is a row with a missing value, skipped)."""
    rows = read_json_rows(path)
    wanted = {tokens_column: TOKENS_FLAG, **({tags_column: TAGS_FLAG} if tags_column is not None else {})}
    if rows:
        check_columns(path, list(rows[0][1]), wanted)
    return rows


def _sentence(location: str, row: dict[str, Any], tokens_column: str, tags_column: str | None,
              scheme: str | None) -> TaggedSentence | str:
    """The row's sentence, or why the row is skipped; a column of the wrong kind raises."""
    missing = [column for column in (tokens_column, tags_column) if column is not None and row.get(column) is None]
    if missing:
        return f"missing {', '.join(map(repr, missing))}"
    tokens = _tokens(location, row[tokens_column], tokens_column)
    tags = None if tags_column is None else _tags(location, row[tags_column], tags_column, scheme)
    if not tokens:
        return f"no tokens in {tokens_column!r}"
    if tags is not None and len(tags) != len(tokens):
        return (f"{len(tokens)} tokens in {tokens_column!r} but {len(tags)} tags in {tags_column!r}; every token "
                "needs one tag")
    identifier = row.get("id")
    return TaggedSentence([check_length(token, location, "token") for token in tokens], tags, location,
                          id=location if identifier in (None, "") else str(identifier))


def _tokens(location: str, value: Any, column: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(token, str) for token in value):
        raise BertkitError(f"{location}: column {column!r} ({TOKENS_FLAG}) holds {_kind(value, (str,))}, not "
                           f"a list of strings (the sentence's tokens); choose the column with {TOKENS_FLAG}")
    return value


def _tags(location: str, value: Any, column: str, scheme: str | None) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(tag, (str, int)) and not isinstance(tag, bool)
                                              for tag in value):
        raise BertkitError(f"{location}: column {column!r} ({TAGS_FLAG}) holds {_kind(value, (str, int))}, not "
                           f"a list of tags (one per token); choose the column with {TAGS_FLAG}")
    number = next((tag for tag in value if isinstance(tag, int)), None)
    if number is not None:
        raise BertkitError(f"{location}: column {column!r} ({TAGS_FLAG}) holds the integer tag {number} without a "
                           "name; write the tags as strings (B-PER, O, ...), or save the `datasets` copy with the "
                           "feature Sequence(ClassLabel(names=[...])) so that the names come with the numbers")
    if scheme is None:
        return value
    bad = next((k for k, tag in enumerate(value) if not is_scheme_tag(tag, scheme)), None)
    if bad is not None:  # as read_conll: a wrong column or scheme fails at its first row
        raise BertkitError(f"{location}: tag {value[bad][:80]!r} (token {bad + 1} of column {column!r}) is not a "
                           f"{scheme} tag ({scheme_tags(scheme)}); choose the tags with {TAGS_FLAG}, the scheme "
                           "with --tag-scheme (BIO, IOB1 or BIOES)")
    return value


def _kind(value: Any, allowed: tuple[type, ...]) -> str:
    """What a value that is not a list of `allowed` items is, for messages: "str", or "a list holding float"."""
    if isinstance(value, list):
        odd = next(item for item in value if not isinstance(item, allowed) or isinstance(item, bool))
        return f"a list holding {type(odd).__name__}"
    return type(value).__name__
