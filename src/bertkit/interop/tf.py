"""Google's original TensorFlow BERT checkpoints -> Hugging Face-layout directories.

A release such as `uncased_L-12_H-768_A-12/` holds `bert_model.ckpt.{index,data-*}`,
`bert_config.json` (already Hugging Face's field names) and `vocab.txt`. The variable names map to
Hugging Face names by a few rules (`bert/encoder/layer_3/attention/self/query/kernel` ->
`bert.encoder.layer.3.attention.self.query.weight`); dense `kernel`s are stored (in, out) and are
transposed to PyTorch's (out, in). Optimizer slots (`adam_m`, `adam_v`) and counters are skipped.

Design decision: the name map works on plain {name: numpy array} dicts, so it is tested without
TensorFlow; only reading the checkpoint file needs the optional `tensorflow` extra.

Reference: google-research/bert modeling.py (variable scopes), run_classifier.py (`output_weights`),
run_squad.py (`cls/squad/output_weights`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.io.atomic import check_writable

SKIPPED = re.compile(r"(^|/)(adam_m|adam_v|global_step|bad_steps|loss_scale|good_steps)$")

# Whole-name renames for heads whose TF names do not follow the scope rules.
HEAD_NAMES = {
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",  # stored (2, H): no transpose
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
    "output_weights": "classifier.weight",  # run_classifier.py, stored (num_labels, H)
    "output_bias": "classifier.bias",
    "cls/squad/output_weights": "qa_outputs.weight",  # run_squad.py, stored (2, H)
    "cls/squad/output_bias": "qa_outputs.bias",
}


def tf_name_to_hf(name: str) -> tuple[str, bool] | None:
    """(Hugging Face name, transpose?) for a TF variable, or None for optimizer state."""
    if SKIPPED.search(name):
        return None
    if name in HEAD_NAMES:
        return HEAD_NAMES[name], False
    parts = []
    for part in name.split("/"):
        layer = re.fullmatch(r"layer_(\d+)", part)
        parts.append(f"layer.{layer.group(1)}" if layer else part)
    last = parts[-1]
    transpose = last == "kernel"
    if last in ("kernel", "gamma"):
        parts[-1] = "weight"
    elif last == "beta":
        parts[-1] = "bias"
    elif last.endswith("_embeddings"):
        parts.append("weight")
    return ".".join(parts), transpose


def tf_weights_to_hf(variables: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Rename (and transpose) every TF variable; unknown names surface later as load errors."""
    state = {}
    for name, array in variables.items():
        mapped = tf_name_to_hf(name)
        if mapped is None:
            continue
        hf_name, transpose = mapped
        tensor = torch.from_numpy(np.ascontiguousarray(array.T if transpose else array)).float()
        state[hf_name] = tensor
    return state


def read_tf_checkpoint(prefix: str | Path) -> dict[str, np.ndarray]:
    """All variables of a TF checkpoint (`.../bert_model.ckpt`), read with TensorFlow."""
    try:
        import tensorflow as tf  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise BertkitError("reading a TensorFlow checkpoint needs TensorFlow: "
                           "pip install -e '.[tensorflow]' (or pip install tensorflow-cpu)") from None
    try:
        reader = tf.train.load_checkpoint(str(prefix))
    except Exception as exc:  # noqa: BLE001 - TF raises many types for a bad path/file
        raise BertkitError(f"{prefix}: not a readable TensorFlow checkpoint ({type(exc).__name__}); give the "
                           "prefix, e.g. uncased_L-12_H-768_A-12/bert_model.ckpt") from None
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def find_checkpoint_prefix(directory: Path) -> Path:
    """The `*.ckpt` prefix inside a Google release directory."""
    indexes = sorted(directory.glob("*.ckpt*.index"))
    if not indexes:
        raise BertkitError(f"{directory}: no TensorFlow checkpoint (*.ckpt.index) found")
    return indexes[-1].with_suffix("")


def convert_tf_checkpoint(source: str | Path, output: str | Path, do_lower_case: bool | None = None,
                          variables: dict[str, np.ndarray] | None = None) -> Path:
    """Convert a Google release directory to a bertkit / Hugging Face directory; returns `output`.

    `variables` may be given directly (tests, or weights read elsewhere); otherwise TensorFlow reads them.
    """
    from bertkit import model as models  # noqa: PLC0415 - keep the torch import lazy
    from bertkit.tokenizer import WordPieceTokenizer  # noqa: PLC0415

    source, output = Path(source), Path(output)
    check_writable(output, "--output")
    config = BertConfig.from_json_file(source / "bert_config.json")
    if variables is None:
        variables = read_tf_checkpoint(find_checkpoint_prefix(source))
    # The heads present say what the checkpoint is: pre-trained, a run_classifier or a run_squad model.
    model: models.BertForSequenceClassification | models.BertForQuestionAnswering | models.BertForPreTraining
    if "output_weights" in variables:
        model = models.BertForSequenceClassification(config.replace(num_labels=variables["output_weights"].shape[0]))
    elif "cls/squad/output_weights" in variables:
        model = models.BertForQuestionAnswering(config)
    else:
        model = models.BertForPreTraining(config)
    model.load_hf_state_dict(tf_weights_to_hf(variables), source=str(source))
    if do_lower_case is None:
        do_lower_case = "uncased" in source.name.lower() or "cased" not in source.name.lower()
    tokenizer = None
    if (source / "vocab.txt").exists():
        tokenizer = WordPieceTokenizer.from_pretrained(source / "vocab.txt", do_lower_case=do_lower_case)
        if tokenizer.vocab_size != config.vocab_size:
            raise BertkitError(f"{source / 'vocab.txt'} has {tokenizer.vocab_size} tokens but bert_config.json "
                               f"says vocab_size {config.vocab_size}")
    model.save_pretrained(output, tokenizer=tokenizer)
    return output
