"""Pre-training shards altered after they were written are refused naming the shard, never read into an
IndexError traceback or trained on quietly (issue 50's audit: ids past the vocabulary loaded without complaint,
masked positions past an instance gave an IndexError, a manifest's `"file": "../elsewhere"` was followed)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from bertkit.data import InstanceSettings, PretrainingDataset, build_pretraining_data
from bertkit.errors import BertkitError
from bertkit.settings import PretrainingDataSettings
from bertkit.tokenizer import WordPieceTokenizer


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_toy_corpus):
    root = tmp_path_factory.mktemp("shards")
    corpus = write_toy_corpus(root / "corpus.txt", documents=10, sentences=(3, 6), words=(4, 12))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=100, min_frequency=1)
    instances = InstanceSettings(max_seq_length=32, masking="static")
    build_pretraining_data(PretrainingDataSettings((str(corpus),), "(in memory)", str(root / "static"), workers=1,
                                                   quiet=True, instances=instances), tokenizer)
    return root / "static"


def _altered(data, tmp_path, array: str, value: int):
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    entry = manifest["shards"][0]
    spec = entry["arrays"][array]
    with open(copy / entry["file"], "r+b") as shard:
        shard.seek(spec["offset"])
        shard.write(np.array([value], dtype=spec["dtype"]).tobytes())
    return copy


@pytest.mark.parametrize("array, value", [("input_ids", 60_000), ("mlm_positions", 60_000)])
def test_an_altered_instance_is_refused_naming_its_shard(data, tmp_path, array, value):
    dataset = PretrainingDataset(_altered(data, tmp_path, array, value))
    with pytest.raises(BertkitError, match=r"shard-00000\.bin: instance 0 is damaged"):
        dataset[0]
    assert dataset[1]["input_ids"].max() < 100  # the others are read as written


def test_a_manifest_that_points_outside_the_directory_is_refused(data, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][0]["file"] = "../elsewhere/shard-00000.bin"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BertkitError, match="is not a file name in the data directory"):
        PretrainingDataset(copy)


def _lower_offsets(manifest):
    manifest["shards"][0]["arrays"]["offsets"]["length"] -= 1


def _fewer_in_shard_and_total(manifest):
    manifest["shards"][0]["num_instances"] -= 2
    manifest["num_instances"] -= 2


def _fewer_in_shard(manifest):
    manifest["shards"][0]["num_instances"] -= 2


def _shard_twice(manifest):
    manifest["shards"].append(manifest["shards"][0])
    manifest["num_instances"] *= 2


def _total_wrong(manifest):
    manifest["num_instances"] = 5


@pytest.mark.parametrize("edit, why", [
    (_lower_offsets, r"shard-00000\.bin: the manifest says [\d,]+ instances, but offsets holds"),
    (_fewer_in_shard_and_total, r"shard-00000\.bin: the manifest says [\d,]+ instances, but offsets holds"),
    (_fewer_in_shard, r"shard-00000\.bin: the manifest says [\d,]+ instances, but offsets holds"),
    (_shard_twice, r"manifest\.json: shard file 'shard-00000\.bin' is listed twice"),
    (_total_wrong, r"manifest\.json: its shards hold [\d,]+ instances, but it says 5;")])
def test_a_manifest_whose_counts_disagree_is_refused_not_read_short_twice_or_past_its_end(data, tmp_path, edit, why):
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BertkitError, match=why + ".*the manifest was altered - re-create the data"):
        PretrainingDataset(copy)


def test_an_in_range_edit_that_breaks_an_instances_shape_is_refused(data, tmp_path):
    """Zeroed bytes are [PAD] ids, each within the vocabulary: the [CLS] ... [SEP] shape still tells."""
    dataset = PretrainingDataset(_altered(data, tmp_path, "input_ids", 0))  # instance 0's [CLS] becomes [PAD]
    with pytest.raises(BertkitError, match=r"shard-00000\.bin: instance 0 is damaged \(its \[CLS\] and \[SEP\] are "
                       r"not where every instance has them\)"):
        dataset[0]
    assert int(dataset[1]["input_ids"][0]) == dataset._cls  # the others are read as written


@pytest.mark.parametrize("value", ["5", None, True, 2.0])
def test_a_shard_count_that_is_not_a_number_is_refused_not_a_type_error(data, tmp_path, value):
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][0]["num_instances"] = value
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BertkitError, match=r"shard-00000\.bin: the manifest says .* instances, but .*re-create"):
        PretrainingDataset(copy)


def test_one_shard_under_two_names_is_refused(data, tmp_path):
    """A hard link (as another case of the name is on macOS and Windows) would pass a check of the names alone."""
    import os

    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    os.link(copy / "shard-00000.bin", copy / "shard-00001.bin")
    manifest["shards"].append({**manifest["shards"][0], "file": "shard-00001.bin"})
    manifest["num_instances"] *= 2
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BertkitError, match="shard files 'shard-00000.bin' and 'shard-00001.bin' are the same file"):
        PretrainingDataset(copy)


@pytest.mark.parametrize("name", ["manifest.json", "shard-00000.bin"])
def test_a_fifo_in_place_of_the_manifest_or_a_shard_is_named_as_such(data, tmp_path, name):
    import os

    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    (copy / name).unlink()
    os.mkfifo(copy / name)
    with pytest.raises(BertkitError, match=f"{name}: a FIFO, not a file"):
        PretrainingDataset(copy)
