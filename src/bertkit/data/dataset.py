"""`PretrainingDataset`: the map-style reader of a pre-training data directory, and its collate.

Items are dicts of 1-D int64 tensors of the instance's real length (not padded): `input_ids`,
`token_type_ids`, `attention_mask`, `mlm_labels` (-100 where not predicted), and a 0-d `nsp_labels`
(0 = B follows A, 1 = random B). `collate_pretraining` pads a list of items to the longest. Data made
with --no-nsp (packed, `layout` is its --packing) has one segment: token types and NSP labels are 0,
and `nsp` is False, so a trainer can refuse to learn NSP from it.

Design decision: shards are memory-mapped, so opening a dataset of any size costs only its manifest
and index arrays, and worker processes of a DataLoader share the page cache. Dynamically masked
data is masked in `__getitem__` with a numpy Generator seeded from (seed, epoch, index): the same
item of the same epoch is masked the same way in any process, on any rank, after any resume;
`set_epoch` picks the epoch.

A training recipe may ask for shorter instances or another masking rate than the data was built with:
`max_seq_length` cuts every longer instance at load with the original pair rule (pop the last token of
the longer segment, B on ties, as Google's `_truncate_seq_pair`), keeping [CLS] A [SEP] B [SEP], the
NSP label and the static masks that survive; `masked_lm_prob` changes the rate of dynamically masked
data (static masks are fixed in the shards).

References: torch.utils.data.Dataset; RoBERTa (Liu et al. 2019, arXiv:1907.11692) for dynamic masking.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from bertkit.data.masking import IGNORE_INDEX, MaskingVocab, mask_batch, prediction_cap
from bertkit.data.shards import check_shard_list, instance_layout, open_shard, read_manifest, verify_shard
from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)
_RAISED_CAPS_LOGGED: set[tuple[Path, int, int]] = set()


class PretrainingDataset(torch.utils.data.Dataset):
    """Instances of a directory written by `bertkit data pretraining`."""

    def __init__(self, directory: str | Path, max_seq_length: int | None = None,
                 masked_lm_prob: float | None = None):
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        self.options = dict(self.manifest["options"])
        self.dynamic = self.options["masking"] == "dynamic"
        self.built_seq_length = int(self.options["max_seq_length"])
        if max_seq_length is not None:
            if max_seq_length < 5:
                raise BertkitError(f"--max-seq-length must be at least 5 ([CLS] A [SEP] B [SEP]), got {max_seq_length}")
            self.options["max_seq_length"] = min(max_seq_length, self.built_seq_length)
        if masked_lm_prob is not None:
            if not self.dynamic:
                raise BertkitError(f"{self.directory} is statically masked, so its masking rate is fixed; rebuild "
                                   "it with `bertkit data pretraining --masking dynamic` to choose --masked-lm-prob")
            if not 0.0 < masked_lm_prob < 1.0:
                raise BertkitError(f"--masked-lm-prob must be in (0, 1), got {masked_lm_prob}")
            self.options["masked_lm_prob"] = masked_lm_prob
            self._fit_prediction_cap(masked_lm_prob)
        check_shard_list(self.directory, self.manifest)
        self.shards = [open_shard(self.directory, entry) for entry in self.manifest["shards"]]
        counts = [entry["num_instances"] for entry in self.manifest["shards"]]
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # (shards+1,)
        self.epoch = 0
        self.vocab = self._masking_vocab() if self.dynamic else None
        special = self.manifest["tokenizer"]["special_token_ids"]
        self._cls, self._sep = int(special["cls"]), int(special["sep"])

    def _fit_prediction_cap(self, masked_lm_prob: float) -> None:
        """Raise the data's cap on predictions per instance (Google's max_predictions_per_seq, set when it was
        built for its own rate) to what `masked_lm_prob` asks of the longest instance, so a higher rate at load
        masks that share of every instance instead of silently stopping at the old cap."""
        needed = prediction_cap(self.options["max_seq_length"], masked_lm_prob)
        cap = int(self.options["max_predictions_per_seq"])
        if needed > cap:
            self.options["max_predictions_per_seq"] = needed
            if (self.directory, cap, needed) in _RAISED_CAPS_LOGGED:  # the training and held-out splits: say it once
                return
            _RAISED_CAPS_LOGGED.add((self.directory, cap, needed))
            logger.info("masking %.0f%% of up to %d tokens: %s's cap of %d predictions per instance raised to %d",
                        100 * masked_lm_prob, self.options["max_seq_length"], self.directory, cap, needed)

    @property
    def vocab_hash(self) -> str:
        """sha256 of the vocabulary the data was tokenized with (compare with the model's tokenizer)."""
        return self.manifest["tokenizer"]["vocab_hash"]

    @property
    def layout(self) -> str:
        """'nsp-pairs' (Google's sentence pairs) or the --packing mode of masked-LM-only (--no-nsp) data."""
        return instance_layout(self.manifest)

    @property
    def nsp(self) -> bool:
        """True when the instances are sentence pairs with NSP labels to learn."""
        return self.layout == "nsp-pairs"

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose masks dynamic masking draws (no effect on static data)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.read(index)

    def read(self, index: int, max_seq_length: int | None = None) -> dict[str, torch.Tensor]:
        """Instance `index`, cut to `max_seq_length` tokens (at most the data's own length) with the pair rule;
        None: to the dataset's `max_seq_length`. Masked after the cut: dynamic masking masks the tokens kept."""
        length = self.options["max_seq_length"] if max_seq_length is None else min(max_seq_length,
                                                                                  self.built_seq_length)
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} instances")
        index = index % len(self)
        shard_index = int(np.searchsorted(self._starts, index, side="right")) - 1
        shard, k = self.shards[shard_index], index - int(self._starts[shard_index])
        start, stop = int(shard["offsets"][k]), int(shard["offsets"][k + 1])
        ids = np.asarray(shard["input_ids"][start:stop], dtype=np.int64)
        a_length = int(shard["a_lengths"][k])  # [CLS] A [SEP]: where segment B starts
        self._check(shard_index, k, start <= stop <= len(shard["input_ids"]) and 0 < a_length <= len(ids)
                    and (not len(ids) or (ids.min() >= 0 and ids.max() < self.vocab_size))
                    and int(shard["nsp_labels"][k]) in (0, 1), "its ids, offsets or labels are out of range")
        # Every layout is [CLS] ... [SEP] with a [SEP] closing segment A (the whole instance when packed), and
        # masking never touches them: an edit that keeps each id in range still breaks this shape.
        self._check(shard_index, k, ids[0] == self._cls and ids[-1] == ids[a_length - 1] == self._sep,
                    "its [CLS] and [SEP] are not where every instance has them")
        labels = None
        if not self.dynamic:
            labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
            m0, m1 = int(shard["mlm_offsets"][k]), int(shard["mlm_offsets"][k + 1])
            positions = np.asarray(shard["mlm_positions"][m0:m1], dtype=np.int64)
            self._check(shard_index, k, 0 <= m0 <= m1 <= len(shard["mlm_positions"])
                        and (not len(positions) or positions.max() < len(ids)), "its masked positions are out of range")
            labels[positions] = shard["mlm_labels"][m0:m1]
        if len(ids) > length:
            kept, a_length = truncated_positions(len(ids), a_length, length)
            ids, labels = ids[kept], None if labels is None else labels[kept]
        if self.vocab is not None:  # dynamic masking
            gen = np.random.default_rng([self.options["seed"], self.epoch, index])
            ids, labels = mask_batch(ids, np.array([0, len(ids)]), self.options["masked_lm_prob"],
                                     self.options["max_predictions_per_seq"], self.vocab, gen)
        token_type_ids = np.zeros(len(ids), dtype=np.int64)
        token_type_ids[a_length:] = 1
        return {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(token_type_ids),
                "attention_mask": torch.ones(len(ids), dtype=torch.int64),
                "mlm_labels": torch.from_numpy(labels),
                "nsp_labels": torch.tensor(int(shard["nsp_labels"][k]), dtype=torch.int64)}

    @property
    def vocab_size(self) -> int:
        """The vocabulary the ids were written with (the manifest's)."""
        return int(self.manifest["tokenizer"]["vocab_size"])

    def _check(self, shard_index: int, k: int, fine: bool, what: str) -> None:
        """Refuse an instance whose stored arrays cannot be what `bertkit data pretraining` wrote (checked as each
        is read: the shards' sha256 is not hashed at every start), naming the shard."""
        if not fine:
            name = self.manifest["shards"][shard_index]["file"]
            raise BertkitError(f"{self.directory / name}: instance {k} is damaged ({what}); the data "
                               "was altered after it was written - re-create it with `bertkit data pretraining`")

    def verify(self) -> None:
        """Check every shard's sha256 against the manifest (reads all data once)."""
        for entry in self.manifest["shards"]:
            if not verify_shard(self.directory, entry):
                raise BertkitError(f"{self.directory / entry['file']}: sha256 does not match the manifest; "
                                   "the file is damaged - re-create the data")

    def _masking_vocab(self) -> MaskingVocab:
        tokenizer = self.manifest["tokenizer"]
        special = tokenizer["special_token_ids"]
        continuation = None
        if self.options["whole_word_masking"]:
            continuation = np.zeros(tokenizer["vocab_size"], dtype=bool)
            continuation[tokenizer["continuation_token_ids"]] = True
        return MaskingVocab(tokenizer["vocab_size"], special["mask"], special["cls"], special["sep"], continuation)


def truncated_positions(length: int, a_length: int, max_seq_length: int) -> tuple[np.ndarray, int]:
    """Which positions of a [CLS] A [SEP] B [SEP] instance of `length` tokens (B from `a_length` on) stay
    when it is cut to `max_seq_length`: tokens are popped from the end of the longer segment, B's on
    ties (Google's `_truncate_seq_pair`); returns (positions, the new a_length)."""
    has_b = length > a_length
    a, b = a_length - 2, length - a_length - 1 if has_b else 0  # tokens of A and of B
    budget = max_seq_length - (3 if has_b else 2)
    excess = max(0, a + b - budget)
    cut = min(excess, abs(a - b))  # first from the longer segment until both are equal ...
    a, b = (a - cut, b) if a > b else (a, b - cut)
    a, b = a - (excess - cut) // 2, b - (excess - cut + 1) // 2  # ... then from both in turn, B first
    kept = [0, *range(1, 1 + a), a_length - 1]
    if has_b:
        kept += [*range(a_length, a_length + b), length - 1]
    return np.asarray(kept, dtype=np.int64), a + 2


def collate_pretraining(items: list[dict[str, torch.Tensor]], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad items to the batch's longest: (B, T) tensors, mlm_labels padded with -100; nsp_labels (B,).
    (A compiled GPU step takes `collate_static`'s batches instead.)"""
    padding = {"input_ids": pad_token_id, "token_type_ids": 0, "attention_mask": 0, "mlm_labels": IGNORE_INDEX}
    batch = {key: pad_sequence([item[key] for item in items], batch_first=True, padding_value=value)
             for key, value in padding.items()}
    batch["nsp_labels"] = torch.stack([item["nsp_labels"] for item in items])
    return batch


def collate_static(items: list[dict[str, torch.Tensor]], pad_token_id: int, max_seq_length: int,
                   max_predictions: int) -> dict[str, torch.Tensor]:
    """A batch of one fixed shape, with everything a GPU step would otherwise read from the device computed here
    on the host, so the step never waits for the device and a compiled step compiles once:

    - `input_ids`, `token_type_ids` (B, T) padded to T = `max_seq_length` whatever the items' lengths;
    - Google's `masked_lm_positions`, `masked_lm_ids` (B, P) int64 and `masked_lm_weights` (B, P) float32 with
      P = `max_predictions`: each row's predicted positions in order, then weight-0 entries (position 0, id 0);
    - `nsp_labels` (B,);
    - only when some row is shorter than T: `attention_mask` (B, T) and the real tokens' layout, `token_indices`
      (N,) int64 positions in the flattened (B*T) batch and `cu_seqlens` (B+1,) int32 (right padding:
      `bertkit.model.padding.Unpadded.from_collated`). A batch without them has no padding.

    Items are `PretrainingDataset`'s (1-D, real length, `mlm_labels` -100 where not predicted). An item longer
    than T or with more than P predictions is a ValueError (the dataset's own length and prediction cap bound
    both)."""
    lengths = np.array([len(item["input_ids"]) for item in items], dtype=np.int64)
    if lengths.max(initial=0) > max_seq_length:
        raise ValueError(f"collate_static: an instance of {int(lengths.max())} tokens exceeds max_seq_length "
                         f"{max_seq_length}")
    batch_size = len(items)
    ids = np.full((batch_size, max_seq_length), pad_token_id, dtype=np.int64)
    types = np.zeros((batch_size, max_seq_length), dtype=np.int64)
    positions = np.zeros((batch_size, max_predictions), dtype=np.int64)
    targets = np.zeros((batch_size, max_predictions), dtype=np.int64)
    weights = np.zeros((batch_size, max_predictions), dtype=np.float32)
    for row, item in enumerate(items):
        length = int(lengths[row])
        ids[row, :length] = item["input_ids"].numpy()
        types[row, :length] = item["token_type_ids"].numpy()
        labels = item["mlm_labels"].numpy()
        where = np.flatnonzero(labels != IGNORE_INDEX)
        if len(where) > max_predictions:
            raise ValueError(f"collate_static: an instance with {len(where)} masked positions exceeds "
                             f"max_predictions {max_predictions}")
        positions[row, :len(where)], targets[row, :len(where)], weights[row, :len(where)] = where, labels[where], 1.0
    batch = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types),
             "masked_lm_positions": torch.from_numpy(positions), "masked_lm_ids": torch.from_numpy(targets),
             "masked_lm_weights": torch.from_numpy(weights),
             "nsp_labels": torch.stack([item["nsp_labels"] for item in items])}
    if (lengths < max_seq_length).any():
        real = np.arange(max_seq_length)[None, :] < lengths[:, None]  # (B, T)
        batch["attention_mask"] = torch.from_numpy(real.astype(np.int64))
        batch["token_indices"] = torch.from_numpy(np.flatnonzero(real))
        batch["cu_seqlens"] = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    return batch


def collate_static_buckets(items: list[dict[str, torch.Tensor]], pad_token_id: int, lengths: tuple[int, ...],
                           max_predictions: int) -> dict[str, torch.Tensor]:
    """`collate_static` padded to the shortest of `lengths` that holds the longest item: a run whose steps read
    instances at a few lengths (a short phase, some full-length steps) compiles one static shape per length."""
    longest = max((len(item["input_ids"]) for item in items), default=0)
    fits = [length for length in sorted(lengths) if length >= longest]  # none: the longest, whose error names the item
    return collate_static(items, pad_token_id, fits[0] if fits else max(lengths), max_predictions)
