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
from typing import Callable, Optional

from torch import Tensor, nn

from ..errors import UnsupportedModelError


@dataclass(frozen=True)
class HeadWeights:
    """How to read one projection as per-head matrices and write it back.

    ``read()`` returns the column-convention tensor ([H, d_head, d_model] for values,
    [H, d_model, d_head] for outputs); ``to_param(w)`` turns such a tensor back into the
    layout of ``param`` (used by steering).
    """

    param: nn.Parameter
    read: Callable[[], Tensor]
    to_param: Optional[Callable[[Tensor], Tensor]] = None
    bias: Optional[Callable[[], Optional[Tensor]]] = None


# ----------------------------------------------------------------------------------------------
# Reading projections as heads (column convention). Conv1D (GPT-2) is transposed here only.


def is_conv1d(module: nn.Module) -> bool:
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def column_weight(module: nn.Module) -> Tensor:
    """The weight as an (out, in) matrix, whatever the module stores. An FSDP2 shard (a
    DTensor) is gathered whole (``full_tensor()``, a collective: every rank must read it)."""
    weight: Tensor = module.weight.detach()  # pyright: ignore[reportCallIssue]  # a Linear/Conv1D weight
    gather = getattr(weight, "full_tensor", None)
    if callable(gather):
        weight = gather()  # pyright: ignore[reportAssignmentType]  # DTensor.full_tensor()
    return weight.t() if is_conv1d(module) else weight


def expand_kv(w: Tensor, n_heads: int) -> Tensor:
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
        b = getattr(module, "bias", None)
        if b is None:
            return None
        b = b.detach()
        if fused_neox:
            b = b.reshape(n_heads, 3, d_head)[:, 2]
        elif fused_groups:
            b = b.reshape(fused_groups, -1, d_head)[:, -1]
        else:
            b = b[rows].reshape(-1, d_head)
        return expand_kv(b, n_heads)

    return HeadWeights(param=module.weight, read=read, bias=bias)  # pyright: ignore[reportArgumentType]


def output_heads(module: nn.Module, n_heads: int, d_head: int) -> HeadWeights:
    """Output projection (nn.Linear or Conv1D): [H, d_model, d_head] and back."""
    conv = is_conv1d(module)

    def read() -> Tensor:
        w = column_weight(module)  # [d_model, H * d_head]
        return w.reshape(w.shape[0], n_heads, d_head).permute(1, 0, 2)

    def to_param(w: Tensor) -> Tensor:
        mat = w.permute(1, 0, 2).reshape(w.shape[1], n_heads * d_head)
        return mat.t() if conv else mat

    def bias() -> Optional[Tensor]:
        b = getattr(module, "bias", None)
        return None if b is None else b.detach()

    return HeadWeights(param=module.weight, read=read, to_param=to_param, bias=bias)  # pyright: ignore[reportArgumentType]
