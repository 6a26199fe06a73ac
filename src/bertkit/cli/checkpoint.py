"""`bertkit info` and `bertkit convert`: look inside a checkpoint, convert Google's TF releases.

Flag parsing only; the work is in bertkit.model.pretrained, bertkit.tasks.finetuned (bertkit_task.json),
bertkit.interop.tf and bertkit.tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from bertkit.errors import BertkitError


def checkpoint_summary(directory: Path) -> dict:
    """Config, parameter count (from tensor shapes, without building the model) and vocabulary."""
    from bertkit.config import BertConfig  # noqa: PLC0415
    from bertkit.model.pretrained import SAFETENSORS_NAME, read_state_dict, safetensors_shapes  # noqa: PLC0415
    from bertkit.tasks.finetuned import read_task_file  # noqa: PLC0415

    config = BertConfig.from_json_file(directory / "config.json")
    weights = directory / SAFETENSORS_NAME
    if weights.exists():
        parameters = sum(_numel(shape) for shape in safetensors_shapes(weights).values())
    else:
        parameters = sum(t.numel() for t in read_state_dict(directory).values())
    summary = {
        "directory": str(directory),
        "architectures": config.architectures or ["(not recorded)"],
        "shape": f"L={config.num_hidden_layers} H={config.hidden_size} A={config.num_attention_heads} "
                 f"I={config.intermediate_size}",
        "parameters": parameters,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size (config)": config.vocab_size,
        "labels": config.label_names,
    }
    summary["vocabulary"] = _vocabulary(directory, config)
    task = read_task_file(directory)
    if task is not None:
        summary["task"] = task
    return summary


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


@click.command(context_settings={"show_default": True})
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def info(directory: Path, as_json: bool) -> None:
    """Show a checkpoint's config, parameter count and vocabulary summary."""
    from bertkit.config import check_model_directory  # noqa: PLC0415

    check_model_directory(directory, flag="")
    summary = checkpoint_summary(directory)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    for key, value in summary.items():
        if isinstance(value, dict):
            click.echo(f"{key}:")
            for sub_key, sub_value in value.items():
                click.echo(f"  {sub_key}: {sub_value}")
        elif key == "parameters":
            click.echo(f"{key}: {value:,} ({value / 1e6:.1f}M)")
        else:
            click.echo(f"{key}: {value}")


@click.command(context_settings={"show_default": True})
@click.option("--tf-checkpoint", "source", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Google release directory with bert_model.ckpt.*, bert_config.json and vocab.txt.")
@click.option("--output", required=True, type=click.Path(path_type=Path),
              help="Directory to write (config.json, model.safetensors, vocab.txt).")
@click.option("--cased/--uncased", "cased", default=None,
              help="Vocabulary casing; by default guessed from the directory name (uncased_... / cased_...).")
def convert(source: Path, output: Path, cased: bool | None) -> None:
    """Convert Google's original TensorFlow BERT checkpoint into a bertkit / Hugging Face directory."""
    from bertkit.interop.tf import convert_tf_checkpoint  # noqa: PLC0415

    if not source.is_dir():
        raise BertkitError(f"--tf-checkpoint {source}: not a directory")
    do_lower_case = None if cased is None else not cased
    convert_tf_checkpoint(source, output, do_lower_case=do_lower_case)
    click.echo(f"wrote {output} (loads with bertkit and transformers' from_pretrained)")


def _vocabulary(directory: Path, config: Any) -> object:
    """What `info` shows of the directory's vocabulary; a problem is shown, not raised: info is where one looks at
    a broken directory."""
    from bertkit.tokenizer import WordPieceTokenizer, check_model_vocabulary  # noqa: PLC0415

    if not ((directory / "vocab.txt").exists() or (directory / "tokenizer.json").exists()):
        return "no vocab.txt or tokenizer.json in this directory"
    try:
        tokenizer = WordPieceTokenizer.from_pretrained(directory)
    except BertkitError as exc:
        return {"problem": str(exc)}
    tokens = tokenizer.vocab
    vocabulary: dict[str, object] = {
        "size": tokenizer.vocab_size,
        "do_lower_case": tokenizer.do_lower_case,
        "continuation pieces (##)": sum(t.startswith("##") for t in tokens),
        "special ids": {t: tokens[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t in tokens},
        "sha256": tokenizer.vocab_hash,
    }
    try:
        check_model_vocabulary(tokenizer, config.vocab_size, directory)
    except BertkitError as exc:
        vocabulary["problem"] = str(exc)
    return vocabulary
