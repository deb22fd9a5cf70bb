"""Reading a projection as per-head matrices (column convention), and writing it back.

    >>> import torch
    >>> w = value_heads(torch.nn.Linear(8, 8), n_heads=2, d_head=4).read()
    >>> tuple(w.shape)
    (2, 4, 8)

Conv1D (GPT-2) is transposed here only; grouped or multi-query key/value heads are expanded to
all H heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from ..errors import UnsupportedModelError
from .effective import effective_bias, effective_weight, stored_layout_module, writable_weight


@dataclass(frozen=True)
class HeadWeights:
    """How to read one projection as per-head matrices and write it back.

    ``read()`` returns the column-convention tensor of the *effective* weight
    ([H, d_head, d_model] for values, [H, d_model, d_head] for outputs; see
    :mod:`.effective`); ``to_param(w)`` turns such a tensor back into the layout of the stored
    parameter (used by steering: a linear map, so it carries deltas too). ``module`` is the
    projection module (its writable parameter is decided by
    :func:`~.effective.writable_weight`); ``fixed_param`` names the parameter directly where
    there is no such module (TransformerLens).
    """

    read: Callable[[], Tensor]
    to_param: Optional[Callable[[Tensor], Tensor]] = None
    bias: Optional[Callable[[], Optional[Tensor]]] = None
    module: Optional[nn.Module] = None
    fixed_param: Optional[nn.Parameter] = None

    def writable(self) -> tuple[Optional[nn.Parameter], str]:
        """(the parameter an edit writes, "") or (None, why it cannot be written)."""
        if self.module is not None:
            return writable_weight(self.module)
        if self.fixed_param is None:
            return None, "no stored parameter is known for it"
        return self.fixed_param, ""

    @property
    def param(self) -> Optional[nn.Parameter]:
        """The parameter an edit writes (None where it cannot be written: :meth:`writable`)."""
        return self.writable()[0]


# ----------------------------------------------------------------------------------------------
# Reading projections as heads (column convention). Conv1D (GPT-2) is transposed here only.


def is_conv1d(module: nn.Module) -> bool:
    """True for GPT-2's ``Conv1D`` (a linear layer whose weight is stored transposed)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def column_weight(module: nn.Module) -> Tensor:
    """The effective weight (:func:`~.effective.effective_weight`: adapters, parametrizations,
    FSDP2 shards gathered) as an (out, in) matrix, whatever the module stores."""
    weight = effective_weight(module)
    return weight.t() if is_conv1d(stored_layout_module(module)) else weight


def expand_kv(w: Tensor, n_heads: int) -> Tensor:
    """Repeat per-group key/value weights so that each of ``n_heads`` heads has its own
    (grouped-query attention: head h uses group h // (n_heads / groups)).

        >>> import torch
        >>> expand_kv(torch.arange(2.).reshape(2, 1, 1), 4).flatten().tolist()
        [0.0, 0.0, 1.0, 1.0]

    Args:
        w: ``[groups, ...]`` weights, one slice per key/value group.
        n_heads: the number of query heads, a multiple of ``groups``.

    Returns:
        ``[n_heads, ...]`` (``w`` itself when there is one group per head).
    """
    groups = w.shape[0]
    if groups == n_heads:
        return w
    if n_heads % groups:
        raise UnsupportedModelError(f"{n_heads} heads cannot share {groups} key/value groups "
                                    "evenly")
    return w.repeat_interleave(n_heads // groups, dim=0)


def value_heads(module: nn.Module, n_heads: int, d_head: int, *, rows: slice = slice(None),
                fused_neox: bool = False, fused_groups: int = 0) -> HeadWeights:
    """Value projection (nn.Linear or Conv1D), optionally a slice of a fused QKV projection.

    ``fused_neox``: rows laid out (head, [q|k|v], d_head). ``fused_groups=G``: rows laid out
    (group, [q_1..q_{H/G}|k|v], d_head), the value the last slot of each of G KV groups
    (Falcon's new decoder architecture)."""

    def read() -> Tensor:
        w = column_weight(module)
        if fused_neox:
            w = w.reshape(n_heads, 3, d_head, w.shape[-1])[:, 2]
        elif fused_groups:
            w = w.reshape(fused_groups, -1, d_head, w.shape[-1])[:, -1]
        else:
            w = w[rows]
            w = w.reshape(-1, d_head, w.shape[-1])
        return expand_kv(w, n_heads)

    def bias() -> Optional[Tensor]:
        b = effective_bias(module)
        if b is None:
            return None
        if fused_neox:
            b = b.reshape(n_heads, 3, d_head)[:, 2]
        elif fused_groups:
            b = b.reshape(fused_groups, -1, d_head)[:, -1]
        else:
            b = b[rows].reshape(-1, d_head)
        return expand_kv(b, n_heads)

    return HeadWeights(read=read, bias=bias, module=module)


def output_heads(module: nn.Module, n_heads: int, d_head: int) -> HeadWeights:
    """Output projection (nn.Linear or Conv1D): [H, d_model, d_head] and back."""
    conv = is_conv1d(stored_layout_module(module))

    def read() -> Tensor:
        w = column_weight(module)  # [d_model, H * d_head]
        return w.reshape(w.shape[0], n_heads, d_head).permute(1, 0, 2)

    def to_param(w: Tensor) -> Tensor:
        mat = w.permute(1, 0, 2).reshape(w.shape[1], n_heads * d_head)
        return mat.t() if conv else mat

    def bias() -> Optional[Tensor]:
        return effective_bias(module)

    return HeadWeights(read=read, to_param=to_param, bias=bias, module=module)


def latent_value_heads(attention: nn.Module, n_heads: int) -> HeadWeights:
    """Multi-head latent attention's values (DeepSeek-V2/V3) as W_V^h [H, v_head_dim, d_model].

    The values come through a compressed latent: c = kv_a_layernorm(kv_a_proj_with_mqa(x)[:r])
    (r = ``kv_lora_rank``; the rest of that projection is the shared rotary key), then
    ``kv_b_proj`` lays out per head [k_nope (qk_nope_head_dim) | v (v_head_dim)]. So
    W_V^h = W_b[h, v rows] diag(g) W_a[:r], with g the latent norm's gain; like the norm feeding
    attention, the latent RMSNorm's per-token 1/rms scale is not part of the matrix.

        >>> import torch
        >>> from transformers import DeepseekV3Config
        >>> from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
        >>> config = DeepseekV3Config(hidden_size=32, num_attention_heads=4, q_lora_rank=16,
        ...     kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)
        >>> latent_value_heads(DeepseekV3Attention(config, 0), 4).read().shape
        torch.Size([4, 8, 32])
    """
    a_proj, b_proj = attention.kv_a_proj_with_mqa, attention.kv_b_proj
    norm = attention.kv_a_layernorm
    sizes: Any = (attention.kv_lora_rank, attention.qk_nope_head_dim, attention.v_head_dim)
    rank, nope, v_dim = (int(size) for size in sizes)
    if not isinstance(a_proj, nn.Module) or not isinstance(b_proj, nn.Module):
        raise UnsupportedModelError(f"{type(attention).__name__}: no latent projections")

    def rows(w: Tensor) -> Tensor:  # kv_b's value rows, per head
        return w.reshape(n_heads, nope + v_dim, *w.shape[1:])[:, nope:]

    def read() -> Tensor:
        latent = column_weight(a_proj)[:rank]                         # [r, d]
        gain = effective_weight(norm) if isinstance(norm, nn.Module) else None
        if gain is not None:
            latent = gain.to(latent.dtype)[:, None] * latent
        return torch.einsum("hvr,rd->hvd", rows(column_weight(b_proj)), latent)

    def bias() -> Optional[Tensor]:
        b = effective_bias(b_proj)
        return None if b is None else rows(b)

    return HeadWeights(read=read, bias=bias, module=b_proj)
