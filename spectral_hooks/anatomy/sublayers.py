"""Where a block splits into its attention and feed-forward sublayers (``resid_mid``).

A sequential block is f = f_ffn o f_attn, with resid_mid = f_attn(x) the residual stream
between them:

* pre-norm (GPT-2, Llama, Mistral, Qwen2, sequential GPT-NeoX): resid_mid = x + a(x), a the
  output of ``attn_out_module`` (kind ``"residual_add"``); f_ffn(h) = h + mlp(norm(h)).
* post-norm (BERT, RoBERTa, XLM-R, ELECTRA, ALBERT): resid_mid = LN(x + attn(x)) is the
  first output of the attention module ``attention`` (kind ``"module_output"``);
  f_ffn(h) = LN(h + mlp(h)).

Parallel blocks (GPT-J, Phi, Cohere, GPT-NeoX/Pythia's default ``use_parallel_residual``)
compute f(x) = x + attn(n1(x)) + mlp(n2(x)): no resid_mid exists and the block Jacobian is
a sum, J = I + J_attn' + J_mlp', not a product, so no split is declared; nor for a family not
listed here (a refusal says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedModelError

__all__ = ["SublayerSplit", "sublayer_split", "SPLIT_FAMILIES"]

#: family -> (kind, LayerParts attribute of the module that gives resid_mid)
SPLIT_FAMILIES = {
    "gpt2": ("residual_add", "attn_out_module"),
    "llama": ("residual_add", "attn_out_module"),
    "mistral": ("residual_add", "attn_out_module"),
    "qwen2": ("residual_add", "attn_out_module"),
    "gpt_neox": ("residual_add", "attn_out_module"),  # use_parallel_residual=False only
    "bert": ("module_output", "attention"),
    "albert": ("module_output", "attention"),
}
_PARALLEL = ("gptj", "phi", "cohere")


@dataclass(frozen=True)
class SublayerSplit:
    """``kind``: "residual_add" (resid_mid = x + output[0] of the module) or "module_output"
    (resid_mid = output[0] of the module); ``attr``: the module's LayerParts attribute."""

    kind: str
    attr: str


def _parallel(anatomy: Any) -> bool:
    config = anatomy.config
    return anatomy.family in _PARALLEL or bool(
        getattr(config, "use_parallel_residual", False)) or bool(
        getattr(config, "parallel_attn", False))


def sublayer_split(anatomy: Any) -> SublayerSplit:
    """The split of ``anatomy``'s blocks; UnsupportedModelError where none is defined."""
    if _parallel(anatomy):
        raise UnsupportedModelError(
            f"{anatomy.family} blocks run attention and MLP in parallel on the same input "
            "(f(x) = x + attn(n1(x)) + mlp(n2(x))): there is no resid_mid between them, so gains "
            "by sublayer are not defined; use the whole-block gains (topology=True)")
    if anatomy.family not in SPLIT_FAMILIES:
        raise UnsupportedModelError(
            f"gains by sublayer are declared for the sequential families {sorted(SPLIT_FAMILIES)} "
            f"only, not {anatomy.family!r} (spectral_hooks/anatomy/sublayers.py says where "
            "resid_mid is); use the whole-block gains (topology=True)")
    return SublayerSplit(*SPLIT_FAMILIES[anatomy.family])
