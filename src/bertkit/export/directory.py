"""What `bertkit export onnx --output DIR` writes beside model.onnx, so the directory deploys on its own.

    check_output_directory(output, model_dir)      refuse a checkpoint (or the model directory) as the output
    write_deploy_files(output, model_dir, tokenizer, architecture) -> names written

The directory is the layout Hugging Face's ONNX tooling (optimum's ORTModelFor*, transformers.AutoTokenizer,
`tokenizers`) reads: model.onnx, config.json (the model's, with `architectures` naming the exported head and
the label map id2label/label2id where the model has labels), the tokenizer (vocab.txt, tokenizer_config.json,
special_tokens_map.json, tokenizer.json), bertkit_task.json where the model was fine-tuned here, and a
sentence-transformers directory's module files (modules.json, its pooling and Normalize folders, their configs),
so `SentenceTransformer(DIR, backend="onnx")` builds the same pipeline on the graph.

Design decision: the model directory's own tokenizer files are copied as they are (a tokenizer.json or
tokenizer_config.json written by another tool keeps its fields); what it lacks is written from the
vocabulary bertkit loaded: tokenizer_config.json and special_tokens_map.json as transformers writes them,
and tokenizer.json as the `tokenizers` BERT pipeline (BertNormalizer, BertPreTokenizer, WordPiece, the
[CLS] A [SEP] B [SEP] template). That pipeline is the one bertkit's own tokenizer runs for every text
except the rare code points where the Rust library departs from Google's rules (tokenizer/engine.py,
HAZARD_RANGES). A feature-based directory's task file is written without its feature-layer entries: the
exported graph already holds encoder and head, so nothing may look for feature_head.safetensors.

References: transformers `PreTrainedTokenizerFast.save_pretrained` file layout; optimum ONNX Runtime
`ORTModel.from_pretrained` (model.onnx + config.json); `tokenizers.processors.TemplateProcessing`.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers import __version__ as tokenizers_version

from bertkit.errors import BertkitError
from bertkit.interop.sentence_transformers import CONFIG_FILES, MODULES_FILE, copy_module_files
from bertkit.io.atomic import write_text_atomic
from bertkit.io.jsonfile import read_json_object
from bertkit.tasks.finetuned import FEATURE_KEYS, TASK_FILE, read_task_file
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.tokenizer.engine import bert_normalizer
from bertkit.tokenizer.google import MAX_INPUT_CHARS_PER_WORD
from bertkit.tokenizer.vocab import CLS, MASK, PAD, SEP, UNK

logger = logging.getLogger(__name__)

GRAPH_FILE = "model.onnx"
MASK_HEADS = ("BertForMaskedLM", "BertForPreTraining")
"""Exports whose users type [MASK] meaning the mask token (fill-mask): special-token text stays special there."""
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json")
CHECKPOINT_FILES = ("model.safetensors", "pytorch_model.bin")


def exported(name: str) -> bool:
    """Whether an export of some model writes `name` into its directory (the graph, config, tokenizer, task and
    sentence-transformers files, and module folders such as 1_Pooling)."""
    return (name in (GRAPH_FILE, "config.json", *TOKENIZER_FILES, TASK_FILE, MODULES_FILE, *CONFIG_FILES)
            or re.fullmatch(r"\d+_[A-Za-z]+", name) is not None)


def check_output_directory(output: Path, model_dir: Path) -> None:
    """Refuse an --output directory that is the model directory or holds a checkpoint (export would replace
    its config.json and tokenizer files)."""
    if output.exists() and not output.is_dir():
        raise BertkitError(f"--output {output} is a file; give a directory, or a path ending in .onnx for the "
                           "graph alone")
    if output.resolve() == model_dir.resolve() or any((output / name).exists() for name in CHECKPOINT_FILES):
        raise BertkitError(f"--output {output} holds a checkpoint; export writes config.json and tokenizer files "
                           "there, so give a new directory")


def write_deploy_files(output: Path, model_dir: Path, tokenizer: WordPieceTokenizer, architecture: str) -> list[str]:
    """Write config.json, the tokenizer files and the task file into `output`; return their names."""
    output.mkdir(parents=True, exist_ok=True)
    config = read_json_object(model_dir / "config.json")
    config["architectures"] = [architecture]
    if "id2label" in config and "label2id" not in config:
        config["label2id"] = {label: int(index) for index, label in config["id2label"].items()}
    write_text_atomic(output / "config.json", json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    written = ["config.json"]
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, output / name)
        elif name == "vocab.txt" or name == "tokenizer_config.json":
            tokenizer.save_pretrained(output)  # both files, from the vocabulary bertkit loaded
        elif name == "special_tokens_map.json":
            special = {"unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK}
            write_text_atomic(output / name, json.dumps(special, indent=2) + "\n")
        else:
            write_text_atomic(output / name, tokenizer_pipeline(tokenizer).to_str(pretty=True) + "\n")
        written.append(name)
    if copy_module_files(model_dir, output):  # SentenceTransformer(DIR, backend="onnx") pools and normalises as here
        written += [name for name in sorted(p.name for p in output.iterdir())
                    if name not in written and name != GRAPH_FILE and name not in TOKENIZER_FILES]
    task = read_task_file(model_dir)
    split_special = architecture not in MASK_HEADS and tokenizer.split_special_tokens  # as bertkit reads the text
    _write_input_rules(output, _max_length(task, config, model_dir), split_special)
    if task is not None:
        task = {key: value for key, value in task.items() if key not in FEATURE_KEYS}
        write_text_atomic(output / TASK_FILE, json.dumps(task, indent=2) + "\n")
        written.append(TASK_FILE)
    return written


def _max_length(task: dict | None, config: dict, model_dir: Path) -> int:
    """The longest input bertkit gives this model, as its loaders resolve it: the fine-tuned length
    (bertkit_task.json), else the sentence-transformers length (sentence_bert_config.json) or the length the
    directory's own tokenizer_config.json gives (a CrossEncoder's, a transformers save), where it fits the position
    table, else the positions."""
    positions = int(config.get("max_position_embeddings", 512))
    length = (task or {}).get("max_seq_length")
    if isinstance(length, int) and length > 0:
        return length
    given = None
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        value = read_json_object(model_dir / name, missing={}, damaged={}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1 << 31:
            given = int(value)
            break
    return min(given, positions) if given else positions


def _write_input_rules(output: Path, max_length: int, split_special: bool) -> None:
    """Write into the tokenizer files what bertkit does with an input, where clients read it:
    tokenizer_config.json's `model_max_length` (transformers' `truncation=True` and pipelines cut there) and
    `split_special_tokens` (a literal "[MASK]" or "[SEP]" in a text is text to bertkit, not the special token;
    a masked-LM export keeps it special, as fill-mask needs), and tokenizer.json's truncation (`tokenizers`
    alone cuts there: without it a text past the position table fails inside the graph)."""
    config = read_json_object(output / "tokenizer_config.json")
    config["model_max_length"] = max_length
    config["split_special_tokens"] = split_special
    write_text_atomic(output / "tokenizer_config.json", json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    try:
        pipeline = Tokenizer.from_file(str(output / "tokenizer.json"))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a file it cannot read
        logger.warning("%s: kept as copied, without a truncation of %d tokens (this tokenizers %s cannot read it: "
                       "%s); clients of it alone must cut inputs themselves", output / "tokenizer.json", max_length,
                       tokenizers_version, exc)
        return
    pipeline.enable_truncation(max_length, strategy="longest_first", direction="right")
    write_text_atomic(output / "tokenizer.json", pipeline.to_str(pretty=True) + "\n")


def tokenizer_pipeline(tokenizer: WordPieceTokenizer) -> Tokenizer:
    """The `tokenizers` pipeline of `tokenizer`'s vocabulary, with BERT's special-token template."""
    vocab = tokenizer.vocab
    pipeline = Tokenizer(models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
                                          continuing_subword_prefix="##"))
    pipeline.normalizer = bert_normalizer(tokenizer.do_lower_case)
    pipeline.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    pipeline.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0", pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, vocab[CLS]), (SEP, vocab[SEP])])
    pipeline.decoder = decoders.WordPiece(prefix="##")
    return pipeline
