"""Parquet files and Hugging Face `datasets` directories, read a few columns and one batch of rows at a time.

Formats: Apache Parquet (`.parquet`, as pandas' `to_parquet`, pyarrow and `Dataset.to_parquet` write it)
and Arrow IPC (`.arrow`: the stream format in which `Dataset.save_to_disk` writes its `data-*.arrow`
shards, or the file format). A directory written by `save_to_disk` (state.json beside the shards) is its
`.arrow` files in the order state.json lists them; a `DatasetDict` directory (dataset_dict.json, one
subdirectory per split) is refused with its splits named, so the split is chosen by giving its
directory (`squad/validation`).

Design decision: pyarrow alone reads them (no `datasets` import at run time), by record batch: a Parquet
file through `ParquetFile.iter_batches` with only the needed columns and a buffered stream (so a column
chunk is not read whole), an Arrow stream memory-mapped one batch at a time (`datasets` writes 1,000 rows
a batch), so memory holds a batch of rows whatever the file's size. Columns are checked against the schema
before any row is read: a missing one is an error listing the columns there are, a text column must
hold strings, a token-tagging column lists. An integer column that `datasets` declared a `ClassLabel` (or
a list of them, as conll2003's `ner_tags`) keeps its names in the schema's "huggingface" metadata
(`class_names`). A file pyarrow cannot read raises `UnreadableFile`, a `BertkitError` the corpus reader
may skip and count instead. pyarrow is imported on first use (0.2 s).

References: Apache Parquet and Arrow IPC format specifications; Hugging Face `datasets`
(`Dataset.save_to_disk`, `arrow_writer.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError
from bertkit.io.jsonfile import read_json_object

COLUMNAR_SUFFIXES = (".parquet", ".arrow")
"""File name endings read as columns of rows instead of lines."""
BATCH_ROWS = 512
"""Rows of a Parquet file decoded at a time (Arrow streams come in the batches they were written in)."""
PARQUET_BUFFER_BYTES = 1 << 20
"""Bytes a Parquet column is read in at a time (pyarrow otherwise reads a row group's column chunk whole)."""
ARROW_FILE_MAGIC = b"ARROW1"
"""The first bytes of an Arrow IPC *file*; a stream (what `save_to_disk` writes) starts otherwise."""


class UnreadableFile(BertkitError):
    """A Parquet or Arrow file that pyarrow cannot read: not one, cut short or corrupt."""


def is_columnar(path: Path) -> bool:
    return path.suffix.lower() in COLUMNAR_SUFFIXES


def dataset_files(directory: Path) -> list[Path] | None:
    """The Arrow files of a `Dataset.save_to_disk` directory in its order, or None for another directory;
    a DatasetDict directory raises, naming its splits."""
    if (directory / "dataset_dict.json").is_file():
        splits = _splits(directory)
        example = directory / splits[0] if splits else directory / "train"
        raise BertkitError(f"{directory}: a Hugging Face DatasetDict with the splits {', '.join(splits) or '(none)'}; "
                           f"give one split's directory, e.g. {example}")
    state_path = directory / "state.json"
    if not state_path.is_file():
        return None
    try:
        state = read_json_object(state_path)
        names = [entry["filename"] for entry in state["_data_files"]]
    except (BertkitError, KeyError, TypeError) as exc:
        raise BertkitError(f"{state_path}: not a `datasets` state.json with a '_data_files' list ({exc}); "
                           "write the directory again with Dataset.save_to_disk") from None
    outside = [name for name in names if not isinstance(name, str) or Path(name).is_absolute()
               or ".." in Path(name).parts]
    if outside:
        raise BertkitError(f"{state_path}: lists {outside[0]!r}, not a file inside the directory as save_to_disk "
                           "writes them; write the directory again with Dataset.save_to_disk")
    files = [directory / name for name in names]
    absent = [str(f) for f in files if not f.is_file()]
    if absent:
        raise BertkitError(f"{directory}: state.json lists {absent[0]}, which is missing; copy the whole "
                           "directory, or write it again with Dataset.save_to_disk")
    return files


def _splits(directory: Path) -> list[str]:
    try:
        splits = read_json_object(directory / "dataset_dict.json")["splits"]
        return [str(s) for s in splits]
    except (BertkitError, KeyError, TypeError):
        return sorted(p.name for p in directory.iterdir() if (p / "state.json").is_file())


def table_files(path: Path) -> list[Path]:
    """The files that hold one table: a Parquet or Arrow file itself, or a `save_to_disk` directory's shards."""
    if not path.is_dir():
        return [path]
    files = dataset_files(path)
    if files is None:
        raise BertkitError(f"{path}: is a directory, but not one written by Dataset.save_to_disk (no state.json); "
                           "give a file, or a dataset's save_to_disk directory")
    return files


def schema(path: Path) -> Any:
    """The file's pyarrow schema (read from the footer or the stream's first message, no rows)."""
    with _guarded(path):
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_schema(path)
        with _arrow_stream(path) as (file_schema, _):
            return file_schema


def check_columns(path: Path, names: list[str], wanted: Mapping[str, str]) -> None:
    """Raise naming the first of `wanted` (column -> the flag that chose it) the file lacks, and its columns."""
    absent = [column for column in wanted if column not in names]
    if absent:
        flag = wanted[absent[0]]
        hint = f"; choose with {flag}" if flag.startswith("--") else ""
        raise BertkitError(f"{path}: no column {absent[0]!r} ({flag}); the columns are "
                           f"{', '.join(map(repr, names))}{hint}")


def check_text_column(path: Path, file_schema: Any, column: str, flag: str) -> None:
    """Raise unless `column` holds strings (nulls, and a column of nulls only, are for the reader to skip)."""
    import pyarrow as pa

    kind = file_schema.field(column).type
    if not (_is_text(kind) or pa.types.is_null(kind)):
        raise BertkitError(f"{path}: column {column!r} ({flag}) holds {kind}, not strings; choose the text "
                           "column with " + flag)


def check_list_column(path: Path, file_schema: Any, column: str, flag: str, integers: bool) -> None:
    """Raise unless `column` holds lists of strings (or, with `integers`, of integers: tag ids), as a
    token-tagging table's tokens and tags columns do (nulls are for the reader to skip)."""
    import pyarrow as pa

    kind = file_schema.field(column).type
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    item = kind.value_type if is_list else None
    if pa.types.is_null(kind) or (item is not None and (_is_text(item) or pa.types.is_null(item) or (
            integers and pa.types.is_integer(item)))):
        return
    wanted = "lists of strings or integers" if integers else "lists of strings"
    raise BertkitError(f"{path}: column {column!r} ({flag}) holds {kind}, not {wanted} (one per sentence); "
                       f"choose the column with {flag}")


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(kind):  # pandas' category dtype
        kind = kind.value_type
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind))


def class_names(file_schema: Any) -> dict[str, list[str]]:
    """Column -> label names of the columns `datasets` declared `ClassLabel`, or a list of them (a tagging
    column: conll2003's `ner_tags`), from its "huggingface" schema metadata, which save_to_disk and
    to_parquet write; empty when there is none."""
    raw = (file_schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(raw)["info"]["features"] if raw else {}
        named = {name: _label_names(feature) for name, feature in features.items()}
        return {name: names for name, names in named.items() if names is not None}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}  # metadata of another writer: no names, values as stored


def _label_names(feature: Any) -> list[str] | None:
    """The names of a `ClassLabel` feature or of a list of one; None for any other feature."""
    if isinstance(feature, list) and len(feature) == 1:  # older `datasets` spell a list feature [inner]
        feature = feature[0]
    elif isinstance(feature, dict) and feature.get("_type") in ("Sequence", "List", "LargeList"):
        feature = feature.get("feature")  # "Sequence" before datasets 4, "List" since
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
        return [str(name) for name in feature["names"]]
    return None


def is_table_input(path: Path) -> bool:
    """A Parquet or Arrow file, or a directory (which must then be a `save_to_disk` one)."""
    return is_columnar(path) or path.is_dir()


def column_names(path: Path) -> list[str]:
    """The columns of a table input (a `datasets` directory: of its first shard)."""
    return list(schema(table_files(path)[0]).names)


def read_rows(path: Path, wanted: Mapping[str, str], text_columns: tuple[str, ...] = (),
              use_class_names: bool = True, list_columns: Mapping[str, bool] | None = None,
              ) -> list[tuple[int, dict[str, Any]]]:
    """Every row of a table input as (row number from 1, {column: value}) for the `wanted` columns (column ->
    the flag that chose it), checked first: each must exist, `text_columns` must hold strings and
    `list_columns` (column -> whether integers may be its items) lists of strings. A `ClassLabel`
    column's integers (each item of a list of them) become their names unless `use_class_names` is False.
    For the small labelled files of fine-tuning, read whole."""
    rows: list[tuple[int, dict[str, Any]]] = []
    for file in table_files(path):
        file_schema = schema(file)
        check_columns(file, list(file_schema.names), wanted)
        for column in text_columns:
            check_text_column(file, file_schema, column, wanted[column])
        for column, integers in (list_columns or {}).items():
            check_list_column(file, file_schema, column, wanted[column], integers)
        names = class_names(file_schema) if use_class_names else {}
        for batch in row_batches(file, list(wanted)):
            for row in batch:
                for column in names.keys() & row.keys():
                    row[column] = _class_name(row[column], names[column])
                rows.append((len(rows) + 1, row))
    return rows


def _class_name(value: Any, names: list[str]) -> Any:
    if isinstance(value, list):  # a list of ClassLabel ids, one per token
        return [_class_name(item, names) for item in value]
    return names[value] if isinstance(value, int) and 0 <= value < len(names) else value  # -1: no label


def row_batches(path: Path, columns: list[str]) -> Iterator[list[dict[str, Any]]]:
    """The rows of `columns` (Python values, None for null), one batch at a time; corrupt data part-way
    raises `UnreadableFile` after the batches before it."""
    with _guarded(path):
        for batch in _record_batches(path, columns):
            yield batch.select(columns).to_pylist()


def column_batches(path: Path, column: str) -> Iterator[list[Any]]:
    """The values of one column (None for null), one batch at a time (see `row_batches`)."""
    with _guarded(path):
        for batch in _record_batches(path, [column]):
            yield batch.column(column).to_pylist()


def _record_batches(path: Path, columns: list[str]) -> Iterator[Any]:
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        with closing(pq.ParquetFile(path, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)) as parquet:
            for group in range(parquet.num_row_groups):  # one at a time: damage in one keeps the rows before it
                yield from parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=columns,
                                                use_threads=False)
        return
    with _arrow_stream(path) as (_, batches):
        yield from batches


@contextmanager
def _arrow_stream(path: Path) -> Iterator[tuple[Any, Iterator[Any]]]:
    """(schema, record batches one at a time) of an Arrow IPC stream or file, memory-mapped."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        is_file = source.read(len(ARROW_FILE_MAGIC)) == ARROW_FILE_MAGIC
        source.seek(0)
        if is_file:
            reader = pa.ipc.open_file(source)
            yield reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            stream = pa.ipc.open_stream(source)
            yield stream.schema, iter(stream)


@contextmanager
def _guarded(path: Path) -> Iterator[None]:
    """pyarrow's errors on a bad file as one `UnreadableFile` naming it."""
    import pyarrow as pa

    try:
        yield
    except FileNotFoundError:
        raise BertkitError(f"{path}: file not found") from None
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # (a string column of invalid UTF-8)
        fmt = "Parquet" if path.suffix.lower() == ".parquet" else "Arrow"
        detail = " ".join(str(exc).split())[:300]
        raise UnreadableFile(f"{path}: not a readable {fmt} file ({detail}); write it again or remove it") from None
