"""The BERT encoder (Devlin et al., 2018, arXiv:1810.04805), readable top to bottom.

    embeddings = LayerNorm(word + position + segment), dropout
    L x post-LN Transformer layer:
        x = LayerNorm(x + dropout(attention(x)))       multi-head self-attention, key-padding mask
        x = LayerNorm(x + dropout(W2 gelu(W1 x)))      feed-forward, exact erf GELU
    pooler = tanh(W h_[CLS])

Design decision: this file says what BERT computes, in plain PyTorch, and nothing about how to make
it fast on some machine. Speed-ups are transforms applied from outside (model/accelerate.py: packed
CPU kernels for inference, torch.compile), and how attention runs is a backend object
(model/attention.py) set as `model.bert.attention`. The default, `Dispatch()`, picks a backend for each
forward from the inputs' device and dtype, the padding and dropout alone: a forward never probes the
machine, reads the environment or writes a cache; measured kernels are installed by whoever builds the
run (`accelerate_for_inference`). So that a transform can swap a piece without this file knowing, each
piece a kernel could fuse is a module of its own: the activation, and each output projection with its
dropout and residual add (`ResidualDense`).

Padding costs nothing: unless the attention backend works on the padded batch, the real tokens are
gathered into one (N, D) matrix after the embeddings (N = non-padding tokens in the batch; padding.py);
projections, feed-forward, LayerNorm and dropout run on it alone. Outputs are padded back, with zeros at
padded positions, whichever backend runs.

Q, K and V are one fused (D, 3D) projection (one matrix multiply instead of three);
model/hf_names.py splits and joins it when reading and writing Hugging Face checkpoints.

The last layer can run at a few positions only (`output_positions`: the masked-LM head's, about 15% of the
tokens): its attention still reads every token's keys and values, but its output projection, feed-forward and
LayerNorms run only at the rows the caller reads, and the rest of the last layer, computed and thrown away before,
is not computed. Per token this is the same function (tested against the full encoder); a layer's dropout draws fewer
elements, so a training run is another draw of the same distribution (and a position listed twice, as [CLS] when it
is also selected or a static batch's weight-0 repeats, draws a mask of its own each time).

Gradient checkpointing (`gradient_checkpointing = True`, `--gradient-checkpointing`): in training, each
layer keeps only its input for the backward and recomputes its inside then (torch.utils.checkpoint,
non-reentrant, dropout masks replayed from the saved RNG state, so the gradients are the same); the
activation memory of L layers becomes one layer's plus L layer inputs, for about one more forward.

Shape legend: B batch, T sequence length, N real tokens, D hidden size, A heads, Dh head size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.model.attention import Attention, Dispatch
from bertkit.model.padding import Unpadded
from bertkit.model.pretrained import PreTrainedMixin, check_fits_in_memory

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,  # exact erf GELU, as the original
    "gelu_new": partial(nn.GELU, approximate="tanh"),
    "gelu_pytorch_tanh": partial(nn.GELU, approximate="tanh"),
    "relu": nn.ReLU,
}


@dataclass
class BertModelOutput:
    last_hidden_state: torch.Tensor  # (B, T, D), zeros at padded positions; (S, D) given output_positions
    pooler_output: torch.Tensor | None = None  # (B, D)
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 x (B, T, D): embeddings, then each layer


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        if self.token_type.num_embeddings == 1 and bool(token_type_ids.any()):  # (static: BERT's own have two)
            raise BertkitError("the model has one segment embedding (type_vocab_size 1), so it reads no second "
                               "text; give single texts (no text pair, no ' ||| ')")
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
        x = self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))  # (B, T, D)


class ResidualDense(nn.Linear):
    """residual + dropout(x W^T + b): the output projection of attention and of the feed-forward
    (transformers' BertSelfOutput and BertOutput, without their LayerNorm). An nn.Linear, so its
    weights keep the names a plain layer has in checkpoints."""

    def __init__(self, in_features: int, out_features: int, dropout: float) -> None:
        super().__init__(in_features, out_features)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:  # type: ignore[override]  # + residual
        return residual + self.dropout(super().forward(x))


class BertLayer(nn.Module):
    """One post-LN Transformer encoder layer, on (N, D) real tokens or a (B, T, D) padded batch."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        d, dropout = config.hidden_size, config.hidden_dropout_prob
        self.num_heads = config.num_attention_heads
        self.attention_dropout = config.attention_probs_dropout_prob
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_out = ResidualDense(d, d, dropout)
        self.attn_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(d, config.intermediate_size)
        self.act = ACTIVATIONS[config.hidden_act]()
        self.ffn_out = ResidualDense(config.intermediate_size, d, dropout)
        self.ffn_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, attention: Attention, layout: Unpadded | torch.Tensor | None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """`rows`: the only rows of the flattened layout, (N, D) or (B*T, D), whose outputs are wanted; given,
        the layer returns (S, D) at those rows alone, their attention still over every token."""
        dropout_p = self.attention_dropout if self.training else 0.0
        context = attention(self.qkv(x), layout, self.num_heads, dropout_p)  # (N, 3D) -> (N, D), or batched
        context, x = keep_rows(context, x, rows)
        x = self.attn_norm(self.attn_out(context, x))
        return self.ffn_norm(self.ffn_out(self.act(self.ffn_in(x)), x))


class BertModel(PreTrainedMixin, nn.Module):
    """Embeddings, L encoder layers and (optionally) the tanh pooler over [CLS].

    `attention` is the attention backend (model/attention.py); the default `Dispatch()` picks one per
    forward from the device, dtype, padding and dropout (no measured kernels: those are installed from
    outside, by `accelerate_for_inference`)."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        check_fits_in_memory(config)
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.attention: Attention = Dispatch()
        self.gradient_checkpointing = False
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        layout: Unpadded | None = None,
        output_positions: torch.Tensor | None = None,
    ) -> BertModelOutput:
        """`layout`: where the real tokens are, when the caller already knows (a collator computes it on the host,
        `Unpadded.from_collated`); then nothing is read from the device here. Else the model finds out from
        `attention_mask` (None: nothing is padded).

        `output_positions`: the only positions whose last hidden state the caller reads, a (B, T) bool mask or
        (B, P) int64 positions in each row (Google's masked_lm_positions). `last_hidden_state` is then (S, D),
        the states at those positions in row-major order (S = the mask's True count, or B*P), zeros where a
        position is padding; the last layer runs at those positions (and [CLS], for the pooler) alone. With
        `output_hidden_states` every layer runs in full and `hidden_states` holds every position."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, D)
        if layout is not None:
            real: torch.Tensor | None = layout.mask
        else:  # whether anything is padded: one read of the device
            real = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()  # (B, T)
        dropout_p = self.config.attention_probs_dropout_prob if self.training else 0.0
        cpu_eager = x.device.type == "cpu" and not torch.compiler.is_compiling()
        fill = float(real.float().mean()) if real is not None and cpu_eager else 1.0  # the share of real tokens
        attention = self.attention.select(x, real is not None, dropout_p, fill)
        where: Unpadded | torch.Tensor | None
        if attention.unpadded:
            everything = torch.ones_like(input_ids, dtype=torch.bool)
            where = layout or Unpadded.from_mask(real if real is not None else everything)
            x = where.unpad(x)  # (N, D)
        else:
            where = None if real is None else real[:, None, None, :]  # key-padding mask (B, 1, 1, T)
        rows = flat = None
        if output_positions is not None and not output_hidden_states and _has_rows(x, where):
            rows, flat = _output_rows(output_positions, where, input_ids.shape, self.pooler is not None)
        hidden = [x]
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for index, layer in enumerate(self.layers):
            only = (rows,) if rows is not None and index == len(self.layers) - 1 else ()  # the last layer's
            if recompute:
                x = checkpoint(layer, x, attention, where, *only, use_reentrant=False)
            else:
                x = layer(x, attention, where, *only)
            if output_hidden_states:
                hidden.append(x)
        if flat is not None:
            return self._sparse_output(x, flat, real, input_ids.shape[0])
        to_batch = partial(_batched, layout=where, real=real)
        last_hidden_state = to_batch(x)
        pooled = torch.tanh(self.pooler(last_hidden_state[:, 0])) if self.pooler is not None else None
        hidden_states = tuple(to_batch(h) for h in hidden) if output_hidden_states else None
        if output_positions is not None:
            last_hidden_state = select_positions(last_hidden_state, output_positions)
        return BertModelOutput(last_hidden_state, pooled, hidden_states)

    def _sparse_output(self, x: torch.Tensor, flat: torch.Tensor, real: torch.Tensor | None, batch: int
                       ) -> BertModelOutput:
        """The output of a last layer run at the rows of the flattened positions `flat` alone (`_output_rows`): (S, D)
        at the positions, then the [CLS] rows (B, D) when there is a pooler; zeros at padded positions, as the full
        encoder's."""
        if real is not None:
            x = x.masked_fill(~real.reshape(-1).index_select(0, flat).unsqueeze(-1), 0.0)
        if self.pooler is None:
            return BertModelOutput(x)
        selected, first = x[: x.shape[0] - batch], x[x.shape[0] - batch:]
        return BertModelOutput(selected, torch.tanh(self.pooler(first)))

    def gradient_checkpointing_enable(self, enable: bool = True) -> None:
        """Recompute each layer in the backward instead of keeping its activations (transformers' name)."""
        self.gradient_checkpointing = enable


def keep_rows(context: torch.Tensor, x: torch.Tensor, rows: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention output and the residual at `rows` of their flattened (N or B*T, D) layout (None: all)."""
    if rows is None:
        return context, x
    width = x.shape[-1]
    return context.reshape(-1, width).index_select(0, rows), x.reshape(-1, width).index_select(0, rows)


def select_positions(states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) -> (S, ...) at `positions`: the True positions of a (B, T) bool mask (row-major order; S read
    from the device), or a (B, P) int64 index of positions in each row (S = B*P, nothing read)."""
    if positions.dtype == torch.bool:
        return states[positions]
    batch, length = states.shape[:2]
    starts = torch.arange(batch, device=states.device).unsqueeze(1) * length  # (B, 1) start of each row
    return states.reshape(batch * length, *states.shape[2:]).index_select(0, (positions + starts).reshape(-1))


def _has_rows(x: torch.Tensor, layout: Unpadded | torch.Tensor | None) -> bool:
    """Whether the layers' working layout holds any row (an all-padding batch unpads to none)."""
    return x.numel() > 0 and not (isinstance(layout, Unpadded) and layout.indices.numel() == 0)


def _output_rows(positions: torch.Tensor, layout: Unpadded | torch.Tensor | None, shape: torch.Size,
                 with_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the rows of the layers' working layout, (N, D) real tokens or the (B*T, D) batch, at `positions`; their
    positions in the flattened (B*T) batch), ordered as `select_positions` orders them, then each sequence's first
    position when `with_first` (the pooler's [CLS]). A padded position maps to some real row: its output is zeroed
    afterwards. A bool mask is read from the device once, here."""
    batch, length = shape
    if positions.dtype == torch.bool:
        flat = positions.reshape(-1).nonzero().squeeze(1)
    else:
        flat = (positions + torch.arange(batch, device=positions.device).unsqueeze(1) * length).reshape(-1)
    if with_first:
        flat = torch.cat([flat, torch.arange(batch, device=positions.device) * length])
    if isinstance(layout, Unpadded):  # a real token's row in (N, D) is the number of real tokens before it
        rank = layout.mask.reshape(-1).cumsum(0) - 1
        return rank.index_select(0, flat).clamp(min=0), flat
    return flat, flat


def _batched(x: torch.Tensor, layout: Unpadded | torch.Tensor | None, real: torch.Tensor | None) -> torch.Tensor:
    """(N, D) or (B, T, D) -> (B, T, D) with zeros at padded positions."""
    if isinstance(layout, Unpadded):
        return layout.pad(x)
    return x if real is None else x.masked_fill(~real[..., None], 0.0)


def init_weights(module: nn.Module, std: float) -> None:
    """The original initialisation: truncated normal (±2 std) weights, zero biases, LayerNorm 1/0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
