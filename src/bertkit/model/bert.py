"""The BERT encoder (Devlin et al., 2018, arXiv:1810.04805), readable top to bottom.

    embeddings = LayerNorm(word + position + segment), dropout
    L x post-LN Transformer layer:
        x = LayerNorm(x + dropout(attention(x)))       multi-head self-attention, key-padding mask
        x = LayerNorm(x + dropout(W2 gelu(W1 x)))      feed-forward, exact erf GELU
    pooler = tanh(W h_[CLS])

Design decision: padding costs nothing. After the embeddings the real tokens are gathered into one
(N, D) matrix (N = number of non-padding tokens in the batch); projections, feed-forward, LayerNorm
and dropout run on it alone, and attention works on each sequence's own tokens (see padding.py).
Outputs are padded back, with zeros at padded positions. `use_unpadding = False` runs the plain padded path,
which gives the same numbers at real positions.

Q, K and V are one fused (D, 3D) projection (one matrix multiply instead of three);
interop/hf.py splits and joins it when reading and writing Hugging Face checkpoints.

At inference on a CPU every dense layer (`BertLayer.dense`) is one oneDNN call with a packed weight,
its GELU or residual add included, and bf16 attention may take batched matrix multiplies (cpu.py);
training and other devices run the plain PyTorch ops written here.

Shape legend: B batch, T sequence length, N real tokens, D hidden size, A heads, Dh head size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.config import BertConfig
from bertkit.model import cpu
from bertkit.model.padding import Unpadded
from bertkit.model.pretrained import PreTrainedMixin, check_fits_in_memory

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,  # exact erf GELU, as the original
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


@dataclass
class BertModelOutput:
    last_hidden_state: torch.Tensor  # (B, T, D), zeros at padded positions
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
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
        x = self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))  # (B, T, D)


class BertLayer(nn.Module):
    """One post-LN Transformer encoder layer."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.attention_dropout = config.attention_probs_dropout_prob
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_out = nn.Linear(d, d)
        self.attn_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(d, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, d)
        self.ffn_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.hidden_act = config.hidden_act
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def attention(self, x: torch.Tensor, layout: Unpadded | None, mask: torch.Tensor | None) -> torch.Tensor:
        """Multi-head self-attention up to (not including) the output projection: (N, D) or (B, T, D)."""
        qkv = self.dense(self.qkv, x)  # (N, 3D) unpadded, or (B, T, 3D)
        if layout is not None:
            return layout.attention(qkv, self.num_heads, self._dropout_p(), self.padded_attention)  # (N, D)
        return self.padded_attention(qkv, mask)  # (B, T, D)

    def padded_attention(self, qkv: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Multi-head attention of (B, T, 3D) packed q|k|v with a (B, 1, 1, T) key-padding mask -> (B, T, D)."""
        batch, seq_len, three_d = qkv.shape
        head_size = three_d // (3 * self.num_heads)
        q, k, v = qkv.view(batch, seq_len, 3, self.num_heads, head_size).permute(2, 0, 3, 1, 4)  # 3 x (B, A, T, Dh)
        if cpu.bmm_attention_applies(q, mask, self._dropout_p()):
            context = cpu.bmm_attention(q, k, v)  # faster than SDPA's CPU kernel for these shapes (cpu.py)
        else:
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self._dropout_p())
        return context.transpose(1, 2).reshape(batch, seq_len, three_d // 3)  # (B, A, T, Dh) -> (B, T, D)

    def _dropout_p(self) -> float:
        return self.attention_dropout if self.training else 0.0

    def forward(self, x: torch.Tensor, layout: Unpadded | None, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attn_norm(self.dense(self.attn_out, self.attention(x, layout, mask), residual=x))
        hidden = self.dense(self.ffn_in, x, activation=self.hidden_act)
        return self.ffn_norm(self.dense(self.ffn_out, hidden, residual=x))

    def dense(self, linear: nn.Linear, x: torch.Tensor, activation: str | None = None,
              residual: torch.Tensor | None = None) -> torch.Tensor:
        """linear(x), then the activation, or dropout and the residual add. At CPU inference this is one
        oneDNN call with a prepacked weight (cpu.py: ~2x faster in fp32 on AMD CPUs); else eager PyTorch."""
        if not self.training and cpu.linear_applies(x, linear, activation):
            return cpu.linear(x, linear, activation, residual)
        if self.training or torch.is_grad_enabled():
            cpu.forget(linear)  # an optimizer step may follow: the next inference packs the new weights
        y = linear(x)
        if activation is not None:
            y = ACTIVATIONS[activation](y)
        return y if residual is None else residual + self.dropout(y)


class BertModel(PreTrainedMixin, nn.Module):
    """Embeddings, L encoder layers and (optionally) the tanh pooler over [CLS]."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        check_fits_in_memory(config)
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.use_unpadding = True
        self.apply(lambda module: init_weights(module, config.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> BertModelOutput:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, D)
        layout, mask = self._layout(attention_mask)
        if layout is not None:
            x = layout.unpad(x)  # (N, D)
        hidden = [x]
        for layer in self.layers:
            x = layer(x, layout, mask)
            if output_hidden_states:
                hidden.append(x)
        to_batch = layout.pad if layout is not None else (lambda t: t)
        last_hidden_state = to_batch(x)
        pooled = torch.tanh(self.pooler(last_hidden_state[:, 0])) if self.pooler is not None else None
        hidden_states = tuple(to_batch(h) for h in hidden) if output_hidden_states else None
        return BertModelOutput(last_hidden_state, pooled, hidden_states)

    def compile_layers(self) -> None:
        """Compile each encoder layer's forward with torch.compile (dynamic shapes, one graph for all layers).

        It fuses what eager mode runs as separate passes over memory (dtype casts, dropout, GELU, residual +
        LayerNorm). Measured on a 2-core CPU (docs/performance.md): ~1.2-1.5x faster bf16 training steps when
        the cores are shared with other jobs, no gain for bert-base on idle cores or for inference. The
        first steps pay the compilation (~30-60 s). Compiled layers take the padded path, since the
        padding-free attention loops over the batch's sequences in Python. Weights and state_dict keys
        are unchanged, so checkpoints are the same.
        """
        self.use_unpadding = False
        for layer in self.layers:
            layer.forward = torch.compile(layer.forward, dynamic=True)

    def _layout(self, attention_mask: torch.Tensor | None) -> tuple[Unpadded | None, torch.Tensor | None]:
        """The unpadding plan, or for the padded path the SDPA key-padding mask (B, 1, 1, T); (None, None)
        when nothing is padded."""
        if attention_mask is None or bool(attention_mask.all()):
            return None, None
        attention_mask = attention_mask.bool()
        if self.use_unpadding:
            return Unpadded.from_mask(attention_mask), None
        return None, attention_mask[:, None, None, :]


def init_weights(module: nn.Module, std: float) -> None:
    """The original initialisation: truncated normal (±2 std) weights, zero biases, LayerNorm 1/0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
