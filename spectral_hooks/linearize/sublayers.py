"""The attention and feed-forward sublayers of a sequential block as functions of their own
residual input, at the recorded call (where resid_mid is: ``anatomy/sublayers.py``).

* ``sublayer="attention"``: f_attn(X) = resid_mid at rows ``positions`` when those rows of the
  block input are X (other rows held at the recording), J_attn = d resid_mid[p] / d x[p].
* ``sublayer="ffn"``: f_ffn(Y) = the block output at rows ``positions`` when those rows of
  resid_mid are Y (other rows held at their recorded resid_mid), J_ffn = d out[p] / d h[p].

Both run the whole block (``functional_call`` on its own float64 parameter copies, as
:mod:`.function`) with a forward hook on the module that gives resid_mid: it reads resid_mid
(attention) or replaces it (ffn: resid_mid := Y, written as the module's output Y for
"module_output", or Y - x for "residual_add" so that x + (Y - x) = Y); the hook is removed
after every call. For token rows of a sequential block f = f_ffn o f_attn, so
J_block = J_ffn J_attn exactly when one row is linearised (``tests/test_linearize_sublayers.py``
checks the factorisation and both factors against ``torch.func.jacfwd``).

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> from spectral_hooks.linearize import dense_block_jacobian
    >>> eye = torch.eye(32, dtype=torch.float64)
    >>> J_attn, J_ffn = (sublayer_jacobian(probe.anatomy, probe.recording, 0, sublayer=s)
    ...                  .matmat(eye) for s in ("attention", "ffn"))
    >>> torch.allclose(J_ffn @ J_attn, dense_block_jacobian(probe.anatomy, probe.recording, 0))
    True
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

from ..anatomy.sublayers import sublayer_split
from ..errors import OptionError, UnsupportedModelError
from .engine import Engine, make_operator
from .function import BlockFunction, agreement_tol, block_function, first_output
from .operator import BlockJacobian

if TYPE_CHECKING:
    from ..anatomy import Anatomy
    from ..recording import Recording

SUBLAYERS = ("attention", "ffn")
__all__ = ["SUBLAYERS", "SublayerFunction", "sublayer_function", "sublayer_jacobian"]


@contextlib.contextmanager
def _hooked(module: torch.nn.Module, hook):
    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


class SublayerFunction(BlockFunction):
    """One sublayer of block ``layer`` restricted to rows ``positions`` (see module doc)."""

    module: torch.nn.Module
    kind: str
    sublayer: str
    mid0: Tensor
    x0: Tensor

    def __init__(self, fn: BlockFunction, module: torch.nn.Module, kind: str, sublayer: str
                 ) -> None:
        super().__init__(fn.block, fn.call, fn.hidden, fn.positions, fn.params, fn.layer,
                         fn.sample, fn.convention, rows=fn.rows)
        self.module, self.kind, self.sublayer = module, kind, sublayer
        with torch.no_grad():
            self.mid0 = self.run(fn.hidden[0])[1].detach()  # recorded resid_mid [L, d]
        keep = torch.ones_like(self.mid0[:, :1])
        keep[self.positions] = 0
        self._mid_base = self.mid0 * keep
        if sublayer == "ffn":
            self.x0 = self.mid0[self.positions].clone()

    def run(self, H: Tensor, mid: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """(block output, resid_mid) [L, d] on input H; ``mid`` replaces resid_mid."""
        seen = {}

        def hook(module, args, output):
            first = first_output(output)
            if self.kind == "residual_add":
                seen["mid"] = H + first[0] if mid is None else mid
                new = None if mid is None else (mid - H)[None]
            else:
                seen["mid"] = first[0] if mid is None else mid
                new = None if mid is None else mid[None]
            if new is None:
                return None
            return (new,) + tuple(output[1:]) if isinstance(output, tuple) else new

        with _hooked(self.module, hook):
            out = self.full(H)
        return out, seen["mid"]

    def __call__(self, X: Tensor) -> Tensor:
        if self.sublayer == "attention":
            return self.run(self._base + self._scatter @ X)[1].index_select(0, self.positions)
        mid = self._mid_base + self._scatter @ X
        return self.run(self.hidden[0], mid)[0].index_select(0, self.positions)


def sublayer_function(anatomy: Anatomy, recording: Recording, layer: int, *, sublayer: str, sample: int = 0,
                      position: int = -1, dtype: torch.dtype = torch.float64
                      ) -> SublayerFunction:
    """The ``sublayer`` of block ``layer`` at its recorded input (token rows, see module doc);
    checked once: f_ffn(f_attn(x0)) must reproduce the block's own output."""
    if sublayer not in SUBLAYERS:
        raise OptionError("sublayer", sublayer, f"one of {SUBLAYERS}")
    split = sublayer_split(anatomy)
    fn = block_function(anatomy, recording, layer, sample=sample, position=position,
                        kind="token", dtype=dtype)
    module = getattr(anatomy.layers[fn.layer], split.attr)
    sub = SublayerFunction(fn, module, split.kind, sublayer)
    with torch.no_grad():
        direct = fn.full(fn.hidden[0])
        split_out = sub.run(fn.hidden[0], sub.mid0)[0]
    err = float((split_out - direct).norm() / direct.norm().clamp_min(1e-300))
    if not err <= agreement_tol(dtype):
        raise UnsupportedModelError(
            f"layer {fn.layer}: the block does not factor through resid_mid as declared "
            f"(relative difference {err:.1e}); the sublayer split of {anatomy.family} in "
            "anatomy/sublayers.py does not hold for this model")
    return sub


def sublayer_jacobian(anatomy: Anatomy, recording: Recording, layer: int, *, sublayer: str, sample: int = 0,
                      position: int = -1, dtype: torch.dtype = torch.float64,
                      method: str = "auto") -> BlockJacobian:
    """d x d operator J_attn or J_ffn at one token row (matvec = JVP, rmatvec = VJP)."""
    fn = sublayer_function(anatomy, recording, layer, sublayer=sublayer, sample=sample,
                           position=position, dtype=dtype)
    return make_operator(Engine(fn, method),
                          f"J_{sublayer}[layer {fn.layer}, token p={fn.rows[0]}]",
                          kind="token", single_query_mode=None)
