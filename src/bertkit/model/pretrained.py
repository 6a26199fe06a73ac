"""Reading and writing Hugging Face-layout checkpoint directories, with every check a user needs.

Design decision: weights are only ever read from safetensors, or from a `pytorch_model.bin` through
`torch.load(weights_only=True)` — never an unsafe unpickling fallback, and never from outside the model
directory (a shard index naming `../x` is refused). Every loaded tensor is checked for a known name, a
floating-point dtype, the right shape and finite values before it touches the model, and the error lists
all offending names at once. Task heads absent from the checkpoint (fine-tuning a pre-trained BERT)
are freshly initialised and listed in `model.newly_initialized`; weights of other heads in the
checkpoint (the MLM head when loading a classifier) are skipped and listed in `model.unused_weights`.
A config is checked against the machine's memory before a model is built from it, so an absurd size
is one error rather than a failed allocation or the OOM killer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.io.atomic import failed_write_advice, write_file_atomic
from bertkit.io.bounded import file_present
from bertkit.io.jsonfile import read_json
from bertkit.model.hf_names import REDUNDANT_HF_KEYS, from_hf, to_hf

log = logging.getLogger(__name__)

SAFETENSORS_NAME = "model.safetensors"
PYTORCH_NAME = "pytorch_model.bin"
HEAD_PREFIXES = ("mlm.", "nsp.", "classifier.", "qa_outputs.")

M = TypeVar("M", bound="PreTrainedMixin")


def read_state_dict(directory: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (single file or sharded with an index)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BertkitError(f"{directory}: not a checkpoint directory (expected config.json + {SAFETENSORS_NAME})")
    for name, reader in ((SAFETENSORS_NAME, _read_safetensors), (PYTORCH_NAME, _read_torch_bin)):
        index = directory / f"{name}.index.json"
        if file_present(directory / name):
            return reader(directory / name)
        if file_present(index):
            return _read_sharded(index, reader)
    raise BertkitError(f"{directory}: no weights found; expected {SAFETENSORS_NAME} or {PYTORCH_NAME}")


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    _check_weights_file(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise BertkitError(f"{path}: unreadable safetensors file ({exc})") from None


def _read_torch_bin(path: Path) -> dict[str, torch.Tensor]:
    _check_weights_file(path)
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure of the safe unpickler is the user's file
        raise BertkitError(
            f"{path}: refused to load — torch.load(weights_only=True) rejected it ({type(exc).__name__}), so it "
            "is not a plain tensor checkpoint. bertkit never falls back to unsafe unpickling; convert the file "
            "to safetensors with a trusted tool first") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BertkitError(f"{path}: expected a dict of tensors")
    return state


def _read_sharded(index: Path, reader: Any) -> dict[str, torch.Tensor]:
    data = read_json(index, fix="the shard index is damaged; download the model again")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise BertkitError(f'{index}: not a shard index; expected {{"weight_map": {{"tensor name": "shard file"}}}}')
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if Path(shard).is_absolute() or ".." in Path(shard).parts:
            raise BertkitError(f"{index}: shard {shard!r} lies outside the model directory; shard files "
                               "must sit beside the index")
        state.update(reader(index.parent / shard))
    return state


def _check_weights_file(path: Path) -> None:
    """A weights file must be a file (a FIFO would hang the reader): refused in one line when it is missing (a shard
    an index names) or something else."""
    if not file_present(path):
        raise BertkitError(f"{path}: missing; copy the whole model directory")


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors header, without reading the tensors."""
    _check_weights_file(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: handle.get_slice(name).get_shape() for name in handle.keys()}  # noqa: SIM118 - safe_open is not iterable
    except (SafetensorError, OSError) as exc:
        raise BertkitError(f"{path}: unreadable safetensors file ({exc})") from None


def memory_limit_bytes() -> int | None:
    """This machine's physical memory, or the container's (cgroup) limit where that is lower."""
    limits = []
    with contextlib.suppress(ValueError, OSError, AttributeError):
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(ValueError, OSError):
            limits.append(int(Path(path).read_text()))  # "max" (no limit) is a ValueError
    return min(limits) if limits else None


def check_fits_in_memory(config: BertConfig) -> None:
    """Refuse a config whose fp32 weights alone exceed the machine's memory, before allocating any of it
    (models on the meta device allocate nothing, so any size is fine there)."""
    if torch.get_default_device().type == "meta":
        return
    limit = memory_limit_bytes()
    needed = 4 * config.parameter_count()
    if limit is not None and needed > limit:
        raise BertkitError(
            f"config: vocab_size {config.vocab_size}, hidden_size {config.hidden_size}, num_hidden_layers "
            f"{config.num_hidden_layers}, intermediate_size {config.intermediate_size} and "
            f"max_position_embeddings {config.max_position_embeddings} make {config.parameter_count():,} "
            f"parameters, {needed / 2**30:,.1f} GiB in fp32: more than this machine's {limit / 2**30:,.1f} GiB "
            "of memory; check these sizes in config.json")


class PreTrainedMixin:
    """from_pretrained / save_pretrained for bertkit models (all nn.Modules with a `config`)."""

    config: BertConfig
    default_num_labels: int | None = None  # task classes that need num_labels set this

    if TYPE_CHECKING:  # from_pretrained calls cls(config): the models' constructors take it
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    @classmethod
    def from_pretrained(cls: type[M], path: str | Path, *, without: tuple[str, ...] = (), **config_overrides: Any) -> M:
        """The model of the checkpoint directory `path`, its config.json changed by `config_overrides`; weights whose
        (Hugging Face) names start with a prefix in `without` are left out and start fresh (a head of other
        labels)."""
        path = Path(path)
        file_present(path / "config.json")  # a FIFO there would wait forever: refused, named
        config = BertConfig.from_json_file(path / "config.json")
        if "id2label" in config_overrides and "num_labels" not in config_overrides:
            config_overrides["num_labels"] = len(config_overrides["id2label"])
        if "num_labels" in config_overrides and "id2label" not in config_overrides:
            config_overrides["id2label"] = None  # the checkpoint's label names belong to its own head
        if config_overrides:
            config = config.replace(**config_overrides)
        try:
            model = cls(config)
        except BertkitError as exc:  # the memory check: name the file whose sizes are absurd
            raise BertkitError(f"{path / 'config.json'}: {exc}") from None
        state = read_state_dict(path)
        model.load_hf_state_dict({k: v for k, v in state.items() if not k.startswith(without)} if without else state,
                                 source=str(path))
        return model

    def load_hf_state_dict(self, hf_state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        """Load Hugging Face-named tensors, checking names, shapes and finiteness."""
        assert isinstance(self, nn.Module)
        if any(k.startswith("mlm.") for k in self.state_dict()):
            _check_tied_decoder(hf_state, source)
        converted, unknown = from_hf(hf_state)
        unused = []
        if not any(k.startswith("bert.") for k in self.state_dict()):  # a bare BertModel: heads are unused
            unused = [k for k in converted if not k.startswith("bert.")]
            converted = {k[len("bert."):]: v for k, v in converted.items() if k.startswith("bert.")}
        expected = self.state_dict()
        if unknown:
            raise BertkitError(f"{source}: not BERT weights — unknown tensor names: {_names(unknown)}")
        missing = [k for k in expected if k not in converted]
        missing_encoder = [k for k in missing if not _fresh_ok(k)]
        if missing_encoder:
            raise BertkitError(f"{source}: missing encoder weights: {_names(missing_encoder)}; "
                               "the checkpoint is incomplete or of a different architecture")
        unused += [k for k in converted if k not in expected]
        deeper = sorted({int(m.group(1)) for k in unused if (m := _ENCODER_LAYER.match(k))})
        if deeper:  # not another head's weights: the encoder itself would lose layers quietly
            raise BertkitError(
                f"{source}: the weights hold encoder layer(s) {', '.join(map(str, deeper))}, which config.json's "
                f"num_hidden_layers {self.config.num_hidden_layers} leaves out; fix num_hidden_layers in config.json "
                "(a smaller model from a deeper one: `bertkit distill --student layers:...`)")
        integer = [f"{k} ({v.dtype})" for k, v in hf_state.items()
                   if not v.is_floating_point() and not REDUNDANT_HF_KEYS.match(k)]
        if integer:
            raise BertkitError(f"{source}: {_names(integer)} are not floating-point tensors; BERT weights are "
                               "float32/float16/bfloat16 (is this an integer-quantized or foreign file?)")
        mismatched = [f"{k} (checkpoint {tuple(v.shape)}, model {tuple(expected[k].shape)})"
                      for k, v in converted.items() if k in expected and v.shape != expected[k].shape]
        if mismatched:
            raise BertkitError(f"{source}: shape mismatch for {_names(mismatched)}; check config.json "
                               "(vocab_size, hidden_size, num_labels) against the weights")
        nonfinite = [k for k, v in converted.items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if nonfinite:
            raise BertkitError(f"{source}: non-finite values (NaN/inf) in {_names(nonfinite)}")
        loadable = {k: v for k, v in converted.items() if k in expected}
        self.load_state_dict(loadable, strict=False)
        self.newly_initialized = missing
        self.unused_weights = unused
        if missing:
            # information: fine-tuning starts every task head this way, and a fine-tuned directory without
            # its head is refused where it is loaded for prediction (tasks.finetuned.load_weights)
            log.info("%s: newly initialised (not in checkpoint): %s", source, _names(missing))
        if unused:
            log.info("%s: skipped weights of other heads: %s", source, _names(unused))

    def save_pretrained(self, path: str | Path, tokenizer: Any = None) -> None:
        """Write config.json + model.safetensors (+ vocab.txt, tokenizer_config.json) that transformers loads."""
        assert isinstance(self, nn.Module)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        hf_state = to_hf(state)
        config = self.config.replace(architectures=[type(self).__name__])
        try:
            write_file_atomic(path / SAFETENSORS_NAME, lambda t: save_file(hf_state, t, metadata={"format": "pt"}))
            write_file_atomic(path / "config.json", config.to_json_file)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
        except (OSError, SafetensorError) as exc:
            fix = failed_write_advice(exc, path)
            if fix is None:
                raise
            raise BertkitError(f"{path}: could not write the model ({exc}); {fix} and save again") from None

    def num_parameters(self) -> int:
        assert isinstance(self, nn.Module)
        return sum(p.numel() for p in self.parameters())


def _check_tied_decoder(hf_state: dict[str, torch.Tensor], source: str) -> None:
    """bertkit's masked-LM head scores words against the word embeddings (BERT's tied decoder); a checkpoint whose
    decoder holds its own matrix (transformers' tie_word_embeddings false) would be read with the wrong one."""
    decoder = hf_state.get("cls.predictions.decoder.weight")
    words = hf_state.get("bert.embeddings.word_embeddings.weight", hf_state.get("embeddings.word_embeddings.weight"))
    if decoder is not None and words is not None and not torch.equal(decoder, words):
        raise BertkitError(f"{source}: its masked-LM decoder has its own matrix (not the word embeddings: "
                           "tie_word_embeddings false), which bertkit's masked-LM head does not have; use transformers "
                           "for its word predictions (fine-tuning and features read the encoder alone and are fine)")


_ENCODER_LAYER = re.compile(r"^(?:bert\.)?layers\.(\d+)\.")
"""An encoder layer's weight name as bertkit names it (after `from_hf`), with its index."""


def _fresh_ok(key: str) -> bool:
    """Parameters that may be absent from a checkpoint: task heads and the pooler."""
    return key.startswith(HEAD_PREFIXES) or ".pooler." in f".{key}"


def _names(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... and {len(names) - limit} more" if len(names) > limit else "")
