"""The end-to-end Jacobian P_l = d h_l[p] / d h_0[p] through the whole stack (METRICS.md,
"Bottleneck"): exact for every model, bidirectional ones included.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> from spectral_hooks.linearize import dense_block_jacobian
    >>> P = end_to_end_jacobians(probe.anatomy, probe.recording, sample=0, position=-1)
    >>> P.shape                                     # P_1, P_2: [L, d, d]
    torch.Size([2, 32, 32])
    >>> J0, J1 = (dense_block_jacobian(probe.anatomy, probe.recording, l) for l in (0, 1))
    >>> torch.allclose(P[1], J1 @ J0, atol=1e-6)    # causal: P_2 = J_1 J_0 (float32 inputs)
    True

The tangent enters at row p of the first recorded block's input; every block then runs on the
full sequence (each with its own recorded mask, positions and rotary inputs), so a bidirectional
model's other positions carry the perturbation back to p; P_l is read at row p of block l's
output. For a causal model this equals the product J_l^(p) ... J_1^(p) of per-position blocks
(rows before p do not depend on row p); for a bidirectional one the product of diagonal blocks
is not the end-to-end Jacobian. ``end_to_end_operators`` gives the same maps matrix-free
(matvec = JVP, rmatvec = VJP through the stack; a matmat / rmatmat of k columns is one forward
with the k tangents / cotangents batched by ``torch.vmap``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from ..errors import RecordingError, fallback
from ..linalg import LinearOperator
from .function import REPLAY_ERRORS, block_function, math_sdpa

if TYPE_CHECKING:
    from ..anatomy import Anatomy
    from ..recording import Recording

__all__ = ["end_to_end_jacobians", "end_to_end_operators"]


def _stack(anatomy: Anatomy, recording: Recording, layers: Sequence[int], sample: int, position: int):
    layers = [anatomy.layer_index(layer) for layer in layers]
    if layers != list(range(layers[0], layers[-1] + 1)):
        raise RecordingError(f"the end-to-end Jacobian needs consecutive recorded layers, got "
                             f"{layers}: instrument with layers=None")
    fns = [block_function(anatomy, recording, layer, sample=sample, position=position)
           for layer in layers]
    first = fns[0]
    p = first.positions

    def outputs(x: Tensor, depth: int) -> list[Tensor]:
        """Rows p of blocks 1..depth's outputs, the input's row p replaced by x [d]."""
        H = first._base + first._scatter @ x[None]
        rows = []
        for fn in fns[:depth]:
            H = fn.full(H)
            rows.append(H.index_select(0, p)[0])
        return rows
    return fns, outputs


def end_to_end_jacobians(anatomy: Anatomy, recording: Recording, *, layers: Sequence[int] | None = None,
                         sample: int = 0, position: int = -1) -> Tensor:
    """[L, d, d]: P_l for l = 1..L over ``layers`` (default: every recorded layer), float64,
    by forward-mode AD (d JVPs through the stack, vectorised)."""
    layers = list(recording.layers if layers is None else layers)
    fns, outputs = _stack(anatomy, recording, layers, sample, position)
    x0 = fns[0].x0[0]
    with math_sdpa(), torch.no_grad():
        jac = torch.func.jacfwd(lambda x: torch.stack(outputs(x, len(fns))))(x0)
    return jac.detach()


def end_to_end_operators(anatomy: Anatomy, recording: Recording, *, layers: Sequence[int] | None = None,
                         sample: int = 0, position: int = -1) -> list[LinearOperator]:
    """P_1, ..., P_L as matrix-free operators (JVP / VJP through the first l blocks)."""
    layers = list(recording.layers if layers is None else layers)
    fns, outputs = _stack(anatomy, recording, layers, sample, position)
    x0 = fns[0].x0[0]
    d = x0.shape[0]

    def make(depth: int) -> LinearOperator:
        def g(x: Tensor) -> Tensor:
            return outputs(x, depth)[-1]

        def matmat(V: Tensor) -> Tensor:  # [d, k]: one forward, the k tangents batched
            with math_sdpa():
                return _vmapped(lambda v: torch.func.jvp(g, (x0,), (v,))[1], V.to(x0.dtype))

        def rmatmat(U: Tensor) -> Tensor:  # [d, k]: one forward and one batched backward
            with math_sdpa():
                pullback = torch.func.vjp(g, x0)[1]
                return _vmapped(lambda u: pullback(u)[0], U.to(x0.dtype))
        return LinearOperator((d, d), matvec=lambda v: matmat(v[:, None])[:, 0],
                              rmatvec=lambda u: rmatmat(u[:, None])[:, 0], matmat=matmat,
                              rmatmat=rmatmat, dtype=x0.dtype, device=x0.device,
                              name=f"P[depth {depth}, end to end]")
    return [make(depth) for depth in range(1, len(fns) + 1)]


def _vmapped(f, X: Tensor) -> Tensor:
    """[d, k] -> [d, k]: f over the columns of X, batched by ``torch.vmap`` (one column: plain;
    column by column where vmap cannot batch an op of the model, with the fallback reported).
    Nothing is kept between calls: a depth's forward graph lives only while it is applied."""
    if X.shape[1] == 1:
        return f(X[:, 0])[:, None]
    try:
        return torch.vmap(f, in_dims=1, out_dims=1)(X)
    except REPLAY_ERRORS as err:
        fallback("linearize.end_to_end_no_vmap",
                 f"torch.vmap over the end-to-end JVP/VJP failed ({err}): columns applied one "
                 "at a time (slower)")
        return torch.stack([f(x) for x in X.T], dim=1)
