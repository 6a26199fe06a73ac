"""Shard files and the manifest of a pre-training data directory: atomic writes, memory-mapped reads.

A shard is one flat binary file holding, back to back (each 8-byte aligned), the arrays

- `input_ids` (uint16 when the vocabulary has at most 65536 ids, else uint32): all instances
  concatenated, masked already when masking is static;
- `offsets` (int64, n+1): instance k is input_ids[offsets[k]:offsets[k+1]];
- `a_lengths` (uint16, n): tokens with segment id 0 ([CLS] A [SEP]); the whole instance in --no-nsp data;
- `nsp_labels` (uint8, n): 1 when B is a random span; 0 throughout in --no-nsp data;
- static masking only: `mlm_offsets` (int64, n+1), `mlm_positions` (uint16) and `mlm_labels`
  (the ids' dtype): instance k predicts mlm_labels[mlm_offsets[k]:mlm_offsets[k+1]] at those
  positions.

`manifest.json` lists the shards with each array's byte offset, dtype and length, the shard's
sha256, and everything about the run (format version, options, tokenizer vocabulary hash, summary).
Its options say what the instances are: `nsp` true, `packing` null for Google's sentence pairs;
`nsp` false and `packing` the mode (bertkit.data.packing) for masked-LM-only packed instances
(`[CLS] sentences [SEP] sentences of the next document [SEP]`, one segment). A manifest without
`nsp` (written before --no-nsp existed) holds pairs; `instance_layout` reads either.

Design decision: every shard streams to a hidden temp file in the same directory and is fsynced and
renamed onto its final name (`bertkit.io.atomic`); the manifest is written the same way only after every
shard: a killed run never leaves a half shard under a real name, and a directory without a manifest
is refused by the reader. Shards hold raw arrays (no pickle), read back with `numpy.memmap`, so
training pages in only what it touches. `input_ids` streams to disk as blocks arrive; only the small
per-instance arrays wait in memory.

References: numpy.memmap; POSIX rename(2) atomicity.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np

from bertkit.errors import BertkitError
from bertkit.io.atomic import AtomicFile, check_writable, temp_glob, write_text_atomic
from bertkit.io.bounded import file_present
from bertkit.io.digest import file_sha256
from bertkit.io.jsonfile import read_json_object

FORMAT_NAME = "bertkit-pretraining-data"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ALIGN = 8


SHARD_DTYPES = ("uint8", "uint16", "uint32", "int64")
"""The dtypes a shard's arrays are written in (ids, lengths, offsets, labels)."""


def ids_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every token id."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class ShardWriter:
    """Appends blocks of instances to the current shard; starts a new one past `max_shard_tokens`."""

    def __init__(self, directory: Path, dtype: np.dtype, static_masking: bool, max_shard_tokens: int):
        self.directory, self.dtype, self.static = directory, dtype, static_masking
        self.max_shard_tokens = max_shard_tokens
        self.shards: list[dict] = []
        self._file: AtomicFile | None = None

    def add(self, ids: np.ndarray, lengths: np.ndarray, a_lengths: np.ndarray, nsp: np.ndarray,
            mlm_counts: np.ndarray | None = None, mlm_positions: np.ndarray | None = None,
            mlm_labels: np.ndarray | None = None) -> None:
        """Append instances: ids (N,) flat, lengths/a_lengths/nsp (n,), static: mlm_* per position."""
        if self._file is None:
            self._open()
        self._write(ids.astype(self.dtype, copy=False))
        self._tokens += len(ids)
        self._parts["lengths"].append(np.asarray(lengths, dtype=np.int64))
        self._parts["a_lengths"].append(np.asarray(a_lengths, dtype=np.uint16))
        self._parts["nsp_labels"].append(np.asarray(nsp, dtype=np.uint8))
        if self.static:
            self._parts["mlm_counts"].append(np.asarray(mlm_counts, dtype=np.int64))
            self._parts["mlm_positions"].append(np.asarray(mlm_positions, dtype=np.uint16))
            self._parts["mlm_labels"].append(np.asarray(mlm_labels, dtype=self.dtype))
        if self._tokens >= self.max_shard_tokens:
            self._close_shard()

    def finish(self) -> list[dict]:
        """Close the last shard; the manifest entries of all shards."""
        if self._file is not None:
            self._close_shard()
        return self.shards

    def _open(self) -> None:
        name = f"shard-{len(self.shards):05d}.bin"
        self._file = AtomicFile(self.directory / name)
        self._sha = hashlib.sha256()
        self._position = 0
        self._tokens = 0
        self._arrays: dict[str, dict] = {}
        self._parts: dict[str, list[np.ndarray]] = {k: [] for k in (
            "lengths", "a_lengths", "nsp_labels", "mlm_counts", "mlm_positions", "mlm_labels")}
        self._arrays["input_ids"] = {"offset": 0, "dtype": self.dtype.name, "length": 0}

    def _write(self, array: np.ndarray) -> None:
        assert self._file is not None  # add() opens a shard before writing
        data = np.ascontiguousarray(array).data.cast("B")  # the array's bytes, not a copy
        self._file.write(data)
        self._sha.update(data)
        self._position += data.nbytes

    def _write_array(self, name: str, array: np.ndarray) -> None:
        padding = -self._position % ALIGN
        self._write(np.zeros(padding, dtype=np.uint8))
        self._arrays[name] = {"offset": self._position, "dtype": array.dtype.name, "length": len(array)}
        self._write(array)

    def _close_shard(self) -> None:
        assert self._file is not None  # called only while a shard is open
        self._arrays["input_ids"]["length"] = self._tokens
        parts = {k: np.concatenate(v) if v else np.zeros(0) for k, v in self._parts.items()}
        n = len(parts["lengths"])
        self._write_array("offsets", np.concatenate([[0], np.cumsum(parts["lengths"])]).astype(np.int64))
        self._write_array("a_lengths", parts["a_lengths"])
        self._write_array("nsp_labels", parts["nsp_labels"])
        if self.static:
            self._write_array("mlm_offsets", np.concatenate([[0], np.cumsum(parts["mlm_counts"])]).astype(np.int64))
            self._write_array("mlm_positions", parts["mlm_positions"])
            self._write_array("mlm_labels", parts["mlm_labels"])
        self._file.commit()
        self.shards.append({"file": self._file.path.name, "num_instances": n, "num_tokens": self._tokens,
                            "bytes": self._position, "sha256": self._sha.hexdigest(), "arrays": self._arrays})
        self._file = None

    def abort(self) -> None:
        """Drop the shard being written (after an error), leaving no temp file behind."""
        if self._file is not None:
            self._file.abort()
            self._file = None


def prepare_output(directory: Path, overwrite: bool) -> None:
    """Create `directory`; refuse to clobber finished data unless `overwrite`; clear our old files."""
    manifest = directory / MANIFEST
    if manifest.exists() and not overwrite:
        raise BertkitError(f"--output {directory}: already holds pre-training data ({MANIFEST}); "
                           "choose another directory or pass --overwrite")
    if directory.exists() and not directory.is_dir():
        raise BertkitError(f"--output {directory}: exists and is not a directory")
    check_writable(directory, "--output")
    directory.mkdir(parents=True, exist_ok=True)
    manifest.unlink(missing_ok=True)  # first, so old shards are never paired with a new manifest
    leftovers = ("shard-*.bin", temp_glob("shard-*.bin"), temp_glob(MANIFEST))
    for old in [path for pattern in leftovers for path in directory.glob(pattern)]:
        old.unlink()


def write_manifest(directory: Path, manifest: dict) -> None:
    write_text_atomic(directory / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not file_present(path):
        raise BertkitError(f"{directory}: no {MANIFEST}; not a bertkit pre-training data directory, or "
                           "its creation did not finish - run `bertkit data pretraining` again")
    manifest = read_json_object(path, fix="re-create the data")
    if manifest.get("format") != FORMAT_NAME or manifest.get("format_version") != FORMAT_VERSION:
        raise BertkitError(f"{path}: format {manifest.get('format')!r} version {manifest.get('format_version')!r}"
                           f" is not {FORMAT_NAME!r} version {FORMAT_VERSION}; re-create the data with this bertkit")
    return manifest


def instance_layout(manifest: dict) -> str:
    """'nsp-pairs' ([CLS] A [SEP] B [SEP] with an NSP label) or the --packing mode of --no-nsp data."""
    options = manifest["options"]
    return "nsp-pairs" if options.get("nsp", True) else str(options["packing"])


def open_shard(directory: Path, entry: dict) -> dict[str, np.ndarray]:
    """The arrays of one shard, memory-mapped read-only, after checking the manifest's entry: a file inside the
    directory, of the size it says, each array of a shard dtype lying within the file (its counts:
    `check_shard_list`, first)."""
    name = entry.get("file")
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise BertkitError(f"{directory / MANIFEST}: shard file {name!r} is not a file name in the data directory; "
                           "the manifest was altered - re-create the data")
    path = Path(directory) / name
    if not file_present(path) or path.stat().st_size != entry["bytes"]:
        raise BertkitError(f"{path}: missing or not {entry['bytes']} bytes as the manifest says; "
                           "the data directory is damaged - re-create it")
    for array, spec in entry["arrays"].items():
        size = np.dtype(spec["dtype"]).itemsize if spec["dtype"] in SHARD_DTYPES else 0
        if not size or not 0 <= spec["offset"] <= spec["offset"] + spec["length"] * size <= entry["bytes"]:
            raise BertkitError(f"{path}: the manifest's {array} array ({spec}) does not lie within the file; the "
                               "manifest was altered - re-create the data")
    arrays = {}
    for name, spec in entry["arrays"].items():
        if spec["length"] == 0:
            arrays[name] = np.zeros(0, dtype=spec["dtype"])
        else:
            arrays[name] = np.memmap(path, dtype=spec["dtype"], mode="r", offset=spec["offset"],
                                     shape=(spec["length"],))
    return arrays


# The per-instance arrays and how many entries each holds for n instances.
PER_INSTANCE = {"offsets": 1, "a_lengths": 0, "nsp_labels": 0, "mlm_offsets": 1}


def _check_counts(path: Path, entry: dict) -> None:
    """Refuse a manifest entry whose instance count disagrees with the lengths of its per-instance arrays or its
    token count with input_ids: reading by the entry's counts would cut the shard short or index past it."""
    if not isinstance(entry, dict) or not isinstance(entry.get("arrays"), dict) \
            or not all(isinstance(spec, dict) for spec in entry["arrays"].values()):
        raise BertkitError(f"{path}: its manifest entry is not a shard's (no arrays); the manifest was altered - "
                           "re-create the data")
    arrays, n = entry["arrays"], entry.get("num_instances")
    if isinstance(n, bool):
        n = None  # JSON's true is not a count
    wrong = [f"{name} holds {_count(arrays[name]['length'])}" for name, extra in PER_INSTANCE.items()
             if name in arrays and arrays[name]["length"] != (n if isinstance(n, int) else -1) + extra]
    if "input_ids" in arrays and arrays["input_ids"]["length"] != entry.get("num_tokens"):
        wrong.append(f"input_ids holds {_count(arrays['input_ids']['length'])} tokens against num_tokens "
                     f"{_count(entry.get('num_tokens'))}")
    if not isinstance(n, int) or n < 0 or wrong:
        why = "; ".join(wrong) or "that is not a count"
        raise BertkitError(f"{path}: the manifest says {_count(n)} instances, but {why}; the manifest was altered - "
                           "re-create the data")


def _check_distinct_files(directory: Path, names: list[str]) -> None:
    """Refuse two names of one file (another case on a case-insensitive filesystem, a hard or symbolic link):
    the name check alone would let a shard be read twice."""
    seen: dict[tuple[int, int], str] = {}
    for name in names:
        try:
            status = (directory / name).stat()
        except (OSError, ValueError):  # missing, or not a name: open_shard says so, naming it
            continue
        first = seen.setdefault((status.st_dev, status.st_ino), name)
        if first != name:
            raise BertkitError(f"{directory / MANIFEST}: shard files {first!r} and {name!r} are the same file; the "
                               "manifest was altered - re-create the data")


def check_shard_list(directory: Path, manifest: dict) -> None:
    """Refuse a manifest that lists a shard file twice, or whose shards' instances do not add up to its
    num_instances: an edit that would train on a shard twice or on part of the data without a word."""
    for entry in manifest["shards"]:
        _check_counts(Path(directory) / str(entry.get("file") if isinstance(entry, dict) else entry), entry)
    listed = Counter(str(entry.get("file")) for entry in manifest["shards"])
    twice = next((name for name, times in listed.items() if times > 1), None)
    if twice is not None:
        raise BertkitError(f"{Path(directory) / MANIFEST}: shard file {twice!r} is listed twice; the manifest was "
                           "altered - re-create the data")
    _check_distinct_files(Path(directory), [str(entry.get("file")) for entry in manifest["shards"]])
    total = sum(entry.get("num_instances", 0) for entry in manifest["shards"])
    if total != manifest.get("num_instances"):
        raise BertkitError(f"{Path(directory) / MANIFEST}: its shards hold {total:,} instances, but it says "
                           f"{_count(manifest.get('num_instances'))}; the manifest was altered - re-create the data")


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else repr(value)


def verify_shard(directory: Path, entry: dict) -> bool:
    """True when the shard's sha256 matches the manifest (reads the whole file)."""
    return file_sha256(Path(directory) / entry["file"]) == entry["sha256"]
