"""`bertkit data pretraining`: text files -> tokenized, paired, masked, sharded pre-training data.

`build_pretraining_data(PretrainingDataSettings)` runs the command: its files and workers, and the
`InstanceSettings` it holds, resolved once (`InstanceSettings.resolved`) and recorded in the manifest.
The pipeline: the main process streams documents from the inputs (`corpus.read_documents`) and cuts
them into blocks of about `shuffle_buffer_mb` of text; worker processes tokenize a block in one
batched `encode_ids` call, make `dupe_factor` passes of Google's pair rules over its documents,
shuffle the block's instances and mask them (or not at all for dynamic masking); the main process
appends the results, in block order, to shards (`shards.ShardWriter`) and writes the manifest last.
A text corpus with no blank line between documents makes NSP pairs whose random next sentence comes
from the same document: said in one warning, with the counts and the fix.

Two executions of the same rules (`InstanceSettings.rng`). 'numpy' (the default): all passes
of a block at once as arrays (`instances.create_pair_spans` + `truncate_spans`), one gather builds
the instances, `masking.mask_positions` masks them; draws come from a numpy Generator seeded from
(seed, block). 'python': the original's per-document functions (`create_instances_from_document`
with `google_mask_fn`), pass d of document i on a `random.Random` seeded from (seed, d, i), so each
document's instances are exactly what the original makes from that generator state (about ten
times slower).

With --no-nsp, a block's sentences are packed into one-segment instances instead of paired
(`packing.pack_instances`: RoBERTa's FULL-SENTENCES by default, no random draw), repeated for
`dupe_factor` passes and masked like pairs; `rng` does not apply.

Design decision: randomness is keyed to positions in the input, never to workers. Blocks are cut by
a fixed rule on the input and results are written in block order, so the shards are byte-identical
for any --workers and across re-runs. Where this differs from the original (which holds the whole
corpus in memory): a random-next B comes from a document of the same block (the bounded shuffle
buffer), not the whole corpus; instances are shuffled within a block, not globally (training
shuffles anyway); each input file starts a new document.

References: google-research/bert `create_pretraining_data.py`; Devlin et al. 2018 (arXiv:1810.04805).
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import logging
import multiprocessing
import os
import random
import signal
import sys
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import chain, pairwise
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bertkit.data.corpus import CorpusStats, expand_inputs, plain_text_bytes, read_documents, split_sentences
from bertkit.data.instances import (
    Instance,
    PairSpans,
    PairStats,
    create_instances_from_document,
    create_pair_spans,
    truncate_spans,
)
from bertkit.data.masking import MaskingVocab, google_mask_fn, mask_positions
from bertkit.data.packing import PackStats, pack_instances
from bertkit.data.shards import FORMAT_NAME, FORMAT_VERSION, ShardWriter, ids_dtype, prepare_output, write_manifest
from bertkit.errors import BertkitError
from bertkit.settings import InstanceSettings, PretrainingDataSettings
from bertkit.tokenizer import WordPieceTokenizer

logger = logging.getLogger(__name__)


@dataclass
class Block:
    """A run of consecutive documents, processed by one worker."""

    index: int
    first_document: int
    """Corpus-wide number of the first document (keys the per-document seeds)."""
    documents: list[list[str]]
    text_bytes: int
    """Bytes of text read up to the end of this block (drives the progress bar)."""


@dataclass
class BlockResult:
    ids: np.ndarray
    lengths: np.ndarray
    a_lengths: np.ndarray
    nsp: np.ndarray
    mlm_counts: np.ndarray | None
    mlm_positions: np.ndarray | None
    mlm_labels: np.ndarray | None
    counts: Counter = field(default_factory=Counter)
    text_bytes: int = 0


# --- worker side ---------------------------------------------------------------------------------

_STATE: dict = {}


def _init_pool_worker(parent: int, *initargs) -> None:
    _exit_with_parent(parent)
    # The inherited heap (torch, tokenizers, ...) is never garbage: freezing it keeps the collector,
    # which runs often while a block's lists are built, from rescanning it (~10% of a worker's time).
    gc.freeze()
    _init_worker(*initargs)


def _exit_with_parent(parent: int) -> None:
    """Have Linux kill this worker when the process that started it dies: a parent killed outright (the OOM
    killer, kill -9) cannot stop its pool, and the workers would live on, holding memory and the caller's pipes."""
    if not sys.platform.startswith("linux"):  # no such call elsewhere: the pool's own shutdown is all there is
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # a libc without prctl
        return
    if os.getppid() != parent:  # the parent died before the call took effect
        os._exit(1)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _init_worker(tokenizer, options: InstanceSettings, vocab: MaskingVocab, parallel_tokenizer: bool) -> None:
    if not parallel_tokenizer:  # one Rust thread pool per worker process would oversubscribe the cores
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    mask_fn = None
    if options.masking == "static" and options.rng == "python":
        mask_fn = google_mask_fn(options.masked_lm_prob, options.max_predictions_per_seq, vocab)
    _STATE.update(tokenizer=tokenizer, options=options, vocab=vocab, mask_fn=mask_fn)


def _document_seed(seed: int, dupe: int, document: int) -> int:
    return (seed << 96) + (dupe << 64) + document


@dataclass
class TokenizedBlock:
    """A block's token ids, flat; sentences and documents without tokens are left out (and counted)."""

    tokens: np.ndarray
    """(N,) ids of all sentences, in order."""
    sentence_offsets: np.ndarray
    """(S+1,) sentence k is tokens[sentence_offsets[k]:sentence_offsets[k+1]]."""
    document_offsets: np.ndarray
    """(D+1,) document d is sentences document_offsets[d]:document_offsets[d+1]."""
    numbers: np.ndarray
    """(D,) corpus-wide number of each document (keys the per-document seeds of the python mode)."""

    def documents(self) -> list[list[list[int]]]:
        """Documents as lists of sentences of ids (the per-document functions' input)."""
        flat, cuts = self.tokens.tolist(), self.sentence_offsets.tolist()
        sentences = [flat[a:b] for a, b in pairwise(cuts)]
        bounds = self.document_offsets.tolist()
        return [sentences[a:b] for a, b in pairwise(bounds)]


def _tokenize_block(block: Block, counts: Counter) -> TokenizedBlock:
    """The block's sentences through one batched `encode_ids` call, as flat arrays."""
    tokenizer, options = _STATE["tokenizer"], _STATE["options"]
    texts = [split_sentences(d) for d in block.documents] if options.split_sentences else block.documents
    ids = tokenizer.encode_ids([s for d in texts for s in d])
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))  # (S_all,) tokens per sentence
    tokens = np.fromiter(chain.from_iterable(ids), dtype=ids_dtype(tokenizer.vocab_size), count=int(lengths.sum()))
    kept = lengths > 0
    document_of = np.repeat(np.arange(len(texts)), np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    kept_per_document = np.bincount(document_of[kept], minlength=len(texts))
    has_tokens = kept_per_document > 0
    counts["sentence_tokens"] += len(tokens)
    counts["unk_tokens"] += int(np.count_nonzero(tokens == tokenizer.unk_token_id))
    counts["sentences"] += int(kept.sum())
    counts["sentences_without_tokens"] += int((~kept).sum())
    counts["documents"] += int(has_tokens.sum())
    counts["documents_without_tokens"] += int((~has_tokens).sum())
    return TokenizedBlock(tokens, np.cumsum([0, *lengths[kept]]), np.cumsum([0, *kept_per_document[has_tokens]]),
                          block.first_document + np.flatnonzero(has_tokens))


def _process_block(block: Block) -> BlockResult:
    options = _STATE["options"]
    counts: Counter = Counter()
    block_tokens = _tokenize_block(block, counts)
    pair_stats = PairStats()
    gen = np.random.default_rng([options.seed, block.index])
    if not options.nsp:
        result = _packed_instances(block_tokens, counts, gen)
    elif options.rng == "python":
        result = _shuffle(_python_instances(block_tokens.documents(), block_tokens.numbers.tolist(), pair_stats), gen)
    else:
        result = _numpy_instances(block_tokens, pair_stats, gen)
    counts.update(dataclasses.asdict(pair_stats))
    counts["instances"] += len(result.lengths)
    counts["instance_tokens"] += len(result.ids)
    counts["random_next"] += int(result.nsp.sum())
    counts["masked_tokens"] += len(result.mlm_positions) if result.mlm_positions is not None else 0
    result.counts, result.text_bytes = counts, block.text_bytes
    return result


def _python_instances(documents: list[list[list[int]]], numbers: list[int], pair_stats: PairStats) -> BlockResult:
    """The original's per-document functions, each (pass, document) on its own `random.Random`."""
    options, vocab = _STATE["options"], _STATE["vocab"]
    passes = []
    for dupe in range(options.dupe_factor):  # one pass of Instance objects in memory at a time
        instances: list[Instance] = []
        for j, number in enumerate(numbers):
            rng = random.Random(_document_seed(options.seed, dupe, number))
            instances.extend(create_instances_from_document(
                documents, j, options.max_seq_length, options.short_seq_prob, vocab.cls_id, vocab.sep_id,
                rng, mask_fn=_STATE["mask_fn"], stats=pair_stats))
        passes.append(_flatten(instances, vocab))
    return _concatenate(passes)


def _numpy_instances(block: TokenizedBlock, pair_stats: PairStats, gen: np.random.Generator) -> BlockResult:
    """All passes of the block at once (`create_pair_spans`), shuffled, assembled, masked in numpy."""
    options, vocab = _STATE["options"], _STATE["vocab"]
    spans = create_pair_spans(block.sentence_offsets, block.document_offsets, options.dupe_factor,
                              options.max_seq_length, options.short_seq_prob, gen, pair_stats)
    spans = truncate_spans(spans, options.max_seq_length - 3, gen, pair_stats)
    result = _assemble(block.tokens, spans.take(gen.permutation(len(spans))), vocab)
    if options.masking == "static":
        _mask_in_chunks(result, options, vocab, gen)
    return result


def _packed_instances(block: TokenizedBlock, counts: Counter, gen: np.random.Generator) -> BlockResult:
    """--no-nsp: the block packed once (`packing.pack_instances`, no random draw), repeated for each of the
    --dupe-factor passes, in corpus order (training shuffles), each pass masked anew when masking is static."""
    options, vocab = _STATE["options"], _STATE["vocab"]
    stats = PackStats()
    packed = pack_instances(block.tokens, block.sentence_offsets, block.document_offsets, options.max_seq_length,
                            options.packing, vocab.cls_id, vocab.sep_id, stats)
    counts.update(dataclasses.asdict(stats))
    passes = options.dupe_factor
    result = BlockResult(np.tile(packed.ids, passes), np.tile(packed.lengths, passes),
                         np.tile(packed.lengths, passes).astype(np.uint16),  # one segment: all of it is "A"
                         np.zeros(len(packed.lengths) * passes, dtype=np.uint8), None, None, None)
    if options.masking == "static":
        _mask_in_chunks(result, options, vocab, gen)
    return result


def _assemble(tokens: np.ndarray, spans: PairSpans, vocab: MaskingVocab) -> BlockResult:
    """`[CLS] A [SEP] B [SEP]` of every instance, concatenated: one gather per chunk of instances."""
    source = np.concatenate([tokens, np.array([vocab.cls_id, vocab.sep_id], dtype=tokens.dtype)])
    cls_at, sep_at = len(tokens), len(tokens) + 1  # the specials' places in `source`
    index_dtype: type[np.signedinteger] = np.int32 if len(source) < 2**31 else np.int64  # half the traffic of int64
    a_lengths, b_lengths = spans.a_stop - spans.a_start, spans.b_stop - spans.b_start
    ids = [source[:0]]  # (no instances: an empty array of the right dtype)
    for lo in range(0, len(spans), CHUNK_INSTANCES):
        chunk = slice(lo, lo + CHUNK_INSTANCES)
        one = np.ones_like(a_lengths[chunk])
        # (n, 5) pieces [CLS], A, [SEP], B, [SEP] of each instance: start in `source`, length.
        starts = np.stack([cls_at * one, spans.a_start[chunk], sep_at * one, spans.b_start[chunk], sep_at * one], 1)
        lengths = np.stack([one, a_lengths[chunk], one, b_lengths[chunk], one], 1).ravel().astype(index_dtype)
        out_starts = np.cumsum(lengths, dtype=index_dtype) - lengths
        gather = np.repeat(starts.ravel().astype(index_dtype) - out_starts, lengths)
        ids.append(source[gather + np.arange(len(gather), dtype=index_dtype)])
    return BlockResult(np.concatenate(ids), a_lengths + b_lengths + 3, (a_lengths + 2).astype(np.uint16),
                       spans.is_random_next.astype(np.uint8), None, None, None)


def _flatten(instances: list[Instance], vocab: MaskingVocab) -> BlockResult:
    """Instances as compact arrays; with masks (python rng) when the instances carry them."""
    n = len(instances)
    lengths = np.fromiter((len(i.tokens) for i in instances), dtype=np.int64, count=n)
    dtype = ids_dtype(vocab.vocab_size)
    ids = np.fromiter(chain.from_iterable(i.tokens for i in instances), dtype=dtype, count=int(lengths.sum()))
    a_lengths = np.fromiter((i.a_length for i in instances), dtype=np.uint16, count=n)
    nsp = np.fromiter((i.is_random_next for i in instances), dtype=np.uint8, count=n)
    result = BlockResult(ids, lengths, a_lengths, nsp, None, None, None)
    if _STATE["mask_fn"] is not None:
        result.mlm_counts = np.fromiter((len(i.masked_positions) for i in instances), dtype=np.int64, count=n)
        result.mlm_positions = np.fromiter(chain.from_iterable(i.masked_positions for i in instances), dtype=np.uint16)
        result.mlm_labels = np.fromiter(chain.from_iterable(i.masked_labels for i in instances), dtype=dtype)
    return result


def _concatenate(parts: list[BlockResult]) -> BlockResult:
    def cat(name):
        arrays = [getattr(p, name) for p in parts]
        return None if arrays[0] is None else np.concatenate(arrays)

    return BlockResult(*(cat(f.name) for f in dataclasses.fields(BlockResult)[:7]))


def _gather(values: np.ndarray, lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Concatenated segments (segment k = `lengths[k]` values) reordered by `order`, vectorised."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    new_lengths = lengths[order]
    new_starts = np.concatenate([[0], np.cumsum(new_lengths)[:-1]]).astype(np.int64)
    source = np.repeat(starts[order] - new_starts, new_lengths) + np.arange(int(new_lengths.sum()))
    return values[source]


def _shuffle(result: BlockResult, gen: np.random.Generator) -> BlockResult:
    """The block's instances in a random order (the original shuffles all instances)."""
    order = gen.permutation(len(result.lengths))
    shuffled = BlockResult(_gather(result.ids, result.lengths, order), result.lengths[order],
                           result.a_lengths[order], result.nsp[order], None, None, None)
    if result.mlm_counts is not None:
        assert result.mlm_positions is not None and result.mlm_labels is not None  # all three are set together
        shuffled.mlm_counts = result.mlm_counts[order]
        shuffled.mlm_positions = _gather(result.mlm_positions, result.mlm_counts, order)
        shuffled.mlm_labels = _gather(result.mlm_labels, result.mlm_counts, order)
    return shuffled


CHUNK_INSTANCES = 8192
"""Instances assembled or masked per vectorised call (bounds the temporary arrays)."""


def _mask_in_chunks(result: BlockResult, options: InstanceSettings, vocab: MaskingVocab,
                    gen: np.random.Generator) -> None:
    offsets = np.zeros(len(result.lengths) + 1, dtype=np.int64)
    np.cumsum(result.lengths, out=offsets[1:])
    counts, positions, labels = [], [], []
    for first in range(0, len(result.lengths), CHUNK_INSTANCES):
        chunk_offsets = offsets[first:first + CHUNK_INSTANCES + 1]
        lo, hi = chunk_offsets[0], chunk_offsets[-1]
        masked, predicted = mask_positions(result.ids[lo:hi], chunk_offsets - lo, options.masked_lm_prob,
                                           options.max_predictions_per_seq, vocab, gen)
        labels.append(result.ids[lo:hi][predicted])
        result.ids[lo:hi] = masked
        owner = np.searchsorted(chunk_offsets - lo, predicted, side="right") - 1  # instance of each prediction
        counts.append(np.bincount(owner, minlength=len(chunk_offsets) - 1))
        positions.append((predicted - (chunk_offsets[owner] - lo)).astype(np.uint16))
    result.mlm_counts, result.mlm_positions, result.mlm_labels = (
        np.concatenate(x) if x else np.zeros(0, dtype=np.int64) for x in (counts, positions, labels))


# --- main side -----------------------------------------------------------------------------------

def _blocks(documents: Iterator[list[str]], stats: CorpusStats, block_bytes: int) -> Iterator[Block]:
    """Consecutive documents in blocks of at least `block_bytes` of text; a small tail joins the last."""
    held: Block | None = None
    current: list[list[str]] = []
    size = first = index = 0
    for document in documents:
        current.append(document)
        size += sum(map(len, document))
        if size >= block_bytes:
            if held is not None:
                yield held
            held = Block(index, first, current, stats.text_bytes)
            index, first, current, size = index + 1, first + len(current), [], 0
    if current and held is not None and size < block_bytes // 2:
        held.documents.extend(current)
        held.text_bytes = stats.text_bytes
    elif current:
        if held is not None:
            yield held
        held = Block(index, first, current, stats.text_bytes)
    if held is not None:
        yield held


def _results(blocks: Iterator[Block], workers: int, initargs: tuple) -> Iterator[BlockResult]:
    """Block results in block order; at most 2 x workers blocks in flight (bounded memory)."""
    if workers == 1:
        _init_worker(*initargs)
        yield from map(_process_block, blocks)
        return
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_pool_worker,
                             initargs=(os.getpid(), *initargs)) as pool:
        pending: deque = deque()
        for block in blocks:
            pending.append(pool.submit(_process_block, block))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def build_pretraining_data(settings: PretrainingDataSettings, tokenizer: WordPieceTokenizer | None = None) -> dict:
    """Build the pre-training data directory `settings.output`; returns its manifest (with the summary).
    `tokenizer`: the vocabulary `settings.tokenizer` names, when the caller holds it already (or built it in
    memory); else it is loaded from there."""
    if tokenizer is None:
        tokenizer = WordPieceTokenizer.from_pretrained(settings.tokenizer)
    options = settings.instances.resolved()  # the manifest records the values used
    workers = settings.workers or os.cpu_count() or 1
    stats = CorpusStats()
    paths = expand_inputs(list(settings.inputs), stats)
    output = Path(settings.output)
    prepare_output(output, settings.overwrite)
    vocab = MaskingVocab.from_tokenizer(tokenizer, options.whole_word_masking)
    dtype = ids_dtype(tokenizer.vocab_size)
    bar = tqdm(total=plain_text_bytes(paths), unit="B", unit_scale=True,
               unit_divisor=1024, desc="pre-training data", disable=settings.quiet, dynamic_ncols=True)
    writer = ShardWriter(output, dtype, options.masking == "static",
                         max(1, int(settings.shard_size_mb * 2**20) // dtype.itemsize))
    counts: Counter = Counter()
    documents = read_documents(paths, stats, settings.strict, settings.text_column)
    blocks = _blocks(documents, stats, int(options.shuffle_buffer_mb * (1 << 20)))
    try:
        for result in _results(blocks, workers, (tokenizer, options, vocab, workers == 1)):
            writer.add(result.ids, result.lengths, result.a_lengths, result.nsp,
                       result.mlm_counts, result.mlm_positions, result.mlm_labels)
            counts.update(result.counts)
            bar.update(result.text_bytes - bar.n)
        shards = writer.finish()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    if counts["instances"] == 0:
        skipped = stats.skipped_said()
        raise BertkitError(f"--input: no instances could be made from {len(paths)} file(s) "
                           f"({counts['documents']} documents with tokens"
                           f"{'; skipped ' + skipped if skipped else ''}); check the files and their format")
    _warn_undivided(stats, counts, options)
    _warn_unknown(settings.tokenizer, counts)
    manifest = _manifest(paths, tokenizer, vocab, options, shards, counts, stats)
    write_manifest(output, manifest)
    return manifest


def _warn_undivided(stats: CorpusStats, counts: Counter, options: InstanceSettings) -> None:
    """One line when NSP pairs came out wrong because text files had no blank line between documents: each such
    file is one document, so a random next sentence often comes from that same document (a negative that is
    not one). (Instances cut to the length happen with documents divided too: Google's pair truncation.)"""
    if not (options.nsp and stats.undivided_files and counts["random_next_same_document"]):
        return
    files = stats.undivided_files
    logger.warning(
        "%s%s: no blank line between documents, so each file was read as one document: %d of %d random-next "
        "sentences came from the same document (next-sentence negatives that are not); put a blank line between "
        "documents, or build --no-nsp data, or give JSONL with one document per line",
        ", ".join(files[:3]), f" and {len(files) - 3} more" if len(files) > 3 else "",
        counts["random_next_same_document"], counts["random_next"])


UNKNOWN_WARNING_RATE = 0.05
"""The [UNK] share of tokens above which data pretraining warns: BERT's own vocabularies leave well under 1%
of their languages' text unknown; 5% means the vocabulary was learned on other text, or cased differently."""


def _warn_unknown(tokenizer: str, counts: Counter) -> None:
    rate = counts["unk_tokens"] / max(1, counts["sentence_tokens"])
    if rate > UNKNOWN_WARNING_RATE:
        logger.warning("--tokenizer %s: %.1f%% of the corpus's tokens are [UNK], which a model cannot learn from; "
                       "train the vocabulary on this corpus (bertkit tokenizer train) or use one for its language "
                       "and casing", tokenizer, 100 * rate)


def _manifest(paths, tokenizer, vocab: MaskingVocab, options, shards, counts: Counter, stats: CorpusStats) -> dict:
    special = {name: getattr(tokenizer, f"{name}_token_id") for name in ("pad", "unk", "cls", "sep", "mask")}
    tokenizer_info = {"vocab_hash": tokenizer.vocab_hash, "vocab_size": tokenizer.vocab_size,
                      "do_lower_case": tokenizer.do_lower_case, "split_special_tokens": tokenizer.split_special_tokens,
                      "special_token_ids": special}
    if vocab.continuation is not None:
        tokenizer_info["continuation_token_ids"] = np.flatnonzero(vocab.continuation).tolist()
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "options": dataclasses.asdict(options),
            "inputs": [{"path": str(p), "bytes": p.stat().st_size} for p in paths],
            "tokenizer": tokenizer_info, "ids_dtype": ids_dtype(tokenizer.vocab_size).name,
            "num_instances": sum(s["num_instances"] for s in shards),
            "num_tokens": sum(s["num_tokens"] for s in shards), "shards": shards,
            "summary": summarize(counts, stats, options.max_seq_length)}


def summarize(counts: Counter, stats: CorpusStats, max_seq_length: int) -> dict:
    """The run's summary: counts, rates, and every skip with its reason. `fill` is the share of the
    instances' max_seq_length positions that hold a token (the rest is padding in a full-length batch)."""
    def ratio(a: int, b: int) -> float:
        return round(a / b, 6) if b else 0.0

    skipped_lines = Counter(stats.skipped_lines)
    if counts["sentences_without_tokens"]:
        skipped_lines["line without tokens (only characters the tokenizer drops)"] += counts["sentences_without_tokens"]
    return {**stats.to_dict(), "skipped_lines": dict(sorted(skipped_lines.items())),
            "documents": counts["documents"], "documents_without_tokens": counts["documents_without_tokens"],
            "sentences": counts["sentences"], "sentence_tokens": counts["sentence_tokens"],
            "unk_rate": ratio(counts["unk_tokens"], counts["sentence_tokens"]),
            "instances": counts["instances"], "instance_tokens": counts["instance_tokens"],
            "masked_tokens": counts["masked_tokens"],
            "masked_fraction": ratio(counts["masked_tokens"], counts["instance_tokens"]),
            "random_next": counts["random_next"],
            "random_next_fraction": ratio(counts["random_next"], counts["instances"]),
            "truncated_instances": counts["truncated_instances"], "truncated_tokens": counts["truncated_tokens"],
            "random_next_same_document": counts["random_next_same_document"],
            "fill": ratio(counts["instance_tokens"], counts["instances"] * max_seq_length),
            "sentences_across_instances": counts["sentences_across_instances"],
            "document_separators": counts["document_separators"]}


def format_summary(manifest: dict) -> str:
    """The summary as aligned text lines for the terminal."""
    s = manifest["summary"]
    masked = (f"{s['masked_fraction']:.2%} of instance tokens" if manifest["options"]["masking"] == "static"
              else "dynamic (at load time)")
    rows = [
        ("files", f"{s['files']} ({s['input_bytes'] / 2**20:.1f} MiB; {len(s['empty_files'])} empty)"),
        ("documents",
         f"{s['documents']:,} ({s['documents_without_tokens']} without tokens, {s['documents_split']} split)"),
        ("sentences", f"{s['sentences']:,} ({s['sentence_tokens']:,} tokens)"),
        ("instances", f"{s['instances']:,} ({s['instance_tokens']:,} tokens, {len(manifest['shards'])} shards)"),
        ("masked", masked),
        _pairing_row(manifest),
        ("fill", f"{s['fill']:.2%} of {manifest['options']['max_seq_length']} positions per instance hold a token"),
        ("[UNK] rate", f"{s['unk_rate']:.4%}"),
        ("truncations", f"{s['truncated_instances']:,} instances, {s['truncated_tokens']:,} tokens cut"),
        ("invalid UTF-8", f"{s['invalid_utf8_lines']} lines (replaced)"),
        ("cut lines", f"{s['lines_cut']} lines over 1,000,000 bytes"),
    ]
    rows += [("skipped lines", f"{n:,} {reason}") for reason, n in s["skipped_lines"].items()]
    rows += [("skipped files", f"{len(files)} {reason}: {', '.join(files)}")
             for reason, files in s["skipped_files"].items()]
    return "\n".join(f"  {name:<16} {value}" for name, value in rows)


def _pairing_row(manifest: dict) -> tuple[str, str]:
    s, packing = manifest["summary"], manifest["options"].get("packing")
    if packing is None:
        return "NSP random next", (f"{s['random_next_fraction']:.2%} "
                                   f"({s['random_next_same_document']} from the same document)")
    return "packing", (f"{packing}, no NSP ({s['document_separators']:,} [SEP]s between documents, "
                       f"{s['sentences_across_instances']:,} sentences split across instances)")
