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
is not the end-to-end Jacobian. ``end_to_end_operators`` gives the same maps matrix-free, as
products of one chain of full-sequence block Jacobians (matvec = JVP, rmatvec = VJP through the
stack, block by block; k columns are one forward of each block with the k tangents /
cotangents batched by ``torch.vmap``); solved together, all depths share each sweep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from ..errors import RecordingError, fallback
from ..linalg import ChainProducts, LinearOperator
from .function import REPLAY_ERRORS, block_function, math_sdpa

if TYPE_CHECKING:
    from ..anatomy import Anatomy
    from ..recording import Recording

__all__ = ["end_to_end_jacobians", "end_to_end_operators"]

#: Columns one vmapped JVP / VJP of a block carries at most: solved together, every depth's
#: columns pass through the first block, and each carries [T, d] activations and [h, T, T]
#: attention scores, so a call is cut into chunks no wider than one depth's block of columns.
COLUMN_CHUNK = 64


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
        H = first.sequence(x[None])
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
    """P_1, ..., P_L as matrix-free operators: the members of one ``linalg.ChainProducts``
    (P_l = R F_l ... F_1 S: S puts a [d] tangent at row p of the sequence, F_i is block i's
    Jacobian on the full sequence, linearised where the stack's own forward puts it, R reads
    row p). Alone, a product is a JVP / VJP through its first l blocks; solved together (one
    ``svds`` of the list), every step is one sweep through the stack for all depths, so the
    sequential block applications grow as L, not L^2. ``n_matvecs`` of the blocks (the group's
    ``counted``) counts the block applications, a column each."""
    layers = list(recording.layers if layers is None else layers)
    fns, _ = _stack(anatomy, recording, layers, sample, position)
    first = fns[0]
    x0 = first.x0[0]
    d, width = x0.shape[0], first.hidden.shape[1]
    row = first.rows[0]
    inputs = [first.sequence(x0[None])]
    with math_sdpa(), torch.no_grad():
        for fn in fns[:-1]:
            inputs.append(fn.full(inputs[-1]))
    blocks = [_sequence_jacobian(fn, H) for fn, H in zip(fns, inputs)]
    rows = slice(row * d, (row + 1) * d)

    def scatter(X: Tensor) -> Tensor:  # [d, c] -> [width * d, c]: X at row p, zeros elsewhere
        Z = X.new_zeros(width * d, X.shape[1])
        Z[rows] = X
        return Z

    def read(Y: Tensor) -> Tensor:  # [width * d, c] -> [d, c]: row p
        return Y[rows]

    S = LinearOperator((width * d, d), matmat=scatter, rmatmat=read, matvec=lambda x: scatter(
        x[:, None])[:, 0], rmatvec=lambda y: y[rows], dtype=x0.dtype, device=x0.device,
        name=f"row {row} into the sequence")
    R = S.T  # the read of row p
    depths = range(1, len(fns) + 1)
    return ChainProducts([[S, *blocks[:depth], R] for depth in depths], counted=blocks,
                         names=[f"P[depth {depth}, end to end]" for depth in depths]).members


def _sequence_jacobian(fn, H: Tensor) -> LinearOperator:
    """Block ``fn``'s Jacobian on the whole [T, d] sequence at input H, on flattened [T d]
    columns (JVP / VJP, the columns batched by ``torch.vmap`` in chunks of COLUMN_CHUNK)."""
    T, d = H.shape

    def matmat(V: Tensor) -> Tensor:
        with math_sdpa():
            return _vmapped(lambda v: torch.func.jvp(fn.full, (H,), (v.view(T, d),))[1]
                            .reshape(-1), V.to(H.dtype))

    def rmatmat(U: Tensor) -> Tensor:
        with math_sdpa():
            pullback = torch.func.vjp(fn.full, H)[1]
            return _vmapped(lambda u: pullback(u.view(T, d))[0].reshape(-1), U.to(H.dtype))
    return LinearOperator((T * d, T * d), matvec=lambda v: matmat(v[:, None])[:, 0],
                          rmatvec=lambda u: rmatmat(u[:, None])[:, 0], matmat=matmat,
                          rmatmat=rmatmat, dtype=H.dtype, device=H.device,
                          name=f"J[block {fn.layer}, whole sequence]")


def _vmapped(f, X: Tensor) -> Tensor:
    """[d, k] -> [d, k]: f over the columns of X, batched by ``torch.vmap`` (one column: plain;
    column by column where vmap cannot batch an op of the model, with the fallback reported).
    Nothing is kept between calls: a depth's forward graph lives only while it is applied."""
    if X.shape[1] == 1:
        return f(X[:, 0])[:, None]
    try:
        return torch.vmap(f, in_dims=1, out_dims=1, chunk_size=COLUMN_CHUNK)(X)
    except REPLAY_ERRORS as err:
        fallback("linearize.end_to_end_no_vmap",
                 f"torch.vmap over the end-to-end JVP/VJP failed ({err}): columns applied one "
                 "at a time (slower)")
        return torch.stack([f(x) for x in X.T], dim=1)
