"""Block replay -> LinearOperator: the Jacobian of one transformer block at its recorded input.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> from spectral_hooks.linalg import eigs
    >>> J = block_jacobian(probe.anatomy, probe.recording, 1)   # d x d, at the last real token
    >>> J.shape, J.positions, bool(eigs(J, 4).converged)
    ((32, 32), (7,), True)

f_l is the whole block (norms, attention, MLP, residual adds) as a function of its residual
input, with every other recorded input (attention mask, position ids, rotary cos/sin) held
fixed and no KV cache (the recording drops it). The block runs with ``torch.func``
(``functional_call``) on ``dtype`` copies of its own parameters and buffers: the user's model is
never mutated and only one block is copied.

* ``kind="token"``: J^(p) = d f(H)[p] / d H[p] (d x d), all other rows of H held fixed;
  ``position=-1`` is the last non-padding token of the sample.
* ``kind="sequence"``: the (n d x n d) Jacobian over the sample's n real (non-padding) positions,
  flattened row-major (position-major: index i*d + j is position i, feature j).

matvec = JVP, rmatvec = VJP. The linearisation is reused: ``torch.func.linearize`` is traced once
(a JVP then costs about one block forward) and one ``torch.func.vjp`` closure serves every
rmatvec; both are built lazily on first use; matmat/rmatmat vmap over them (a column loop if vmap
fails). Split single-query blocks (below) instead run one shared traced JVP graph
(:mod:`.shared`) and its transpose for the VJP, at a few fixed widths; on CUDA devices both are
replayed from CUDA graphs (:mod:`.cuda_graphs`). Forward-mode AD does not exist for fused SDPA
kernels, so everything runs under
``sdpa_kernel(SDPBackend.MATH)``; if forward AD still fails (a custom kernel), matvecs fall back
to a central finite difference with step h = eps^(1/3) * max(1, ||x0||_inf) / ||v||_inf (eps of
``dtype``; error O(h^2), ~1e-10 relative in float64) and a warning is logged; VJPs fall back to
``torch.autograd`` where ``torch.func`` refuses a kernel.

Speed lever (token kind, causal models): with the other rows fixed, the output at p depends on
H[p] only through row p's query, key and value, so :mod:`.single_query` runs the block on the
single row p, with the earlier positions' keys/values computed once and fed through a duck-typed
HF ``cache``; a JVP then costs ~1/L of a full-sequence one. It is used only after a forward check
against the full-sequence block (else the full sequence runs): GPT-2, GPT-Neo, GPT-NeoX, the
Llama family, Gemma 2/3 and OLMo2 blocks qualify; BERT/ALBERT (bidirectional) and TL bridges run
the full sequence. Where the HF attention core is pluggable and the check passes ("split" mode:
GPT-2, GPT-NeoX, the Llama family, Gemma 2/3, OLMo2), the query row is scored against the fixed
keys and its own key separately, 32 rows run at once, and one traced JVP graph
(:mod:`.shared`, per width: 1 column for a Krylov step, 32, 64 or 128) serves every block of the
same structure, so no block is traced by ``torch.func.linearize`` of its own; such operators carry
``block_size=32`` and ``eigs`` runs block Krylov on them on an accelerator (on the CPU one
column per step, or, with ``materialize="auto"``, their matrix where that is cheaper; see
:func:`~spectral_hooks.linalg.eigs`).

Implementations a replay can trace: a family's ``call_convention.replay_context`` (an anatomy
fact) is entered around every call of its block, e.g. mixture-of-experts layers switch from
grouped-matmul kernels (no float64, no forward AD) to batched matmuls, BLOOM's GeLU
``autograd.Function`` to its formula; the user's settings are restored on exit.

Norms in the analysis dtype: HF's Llama-family RMSNorms (and Gemma 2's eager softmax) compute
in float32 even in a float64 model (``anatomy.norm_upcasts``); every replay runs under a torch
function mode that keeps float64 tensors float64 (``function._KeepFloat64``), so a float64
operator is linear to rounding (~1e-16) whatever the model's own dtype.

Operators say what they are (:mod:`.operator`): :class:`BlockJacobian` (``layer``, ``sample``,
``positions``, ``kind``, ``single_query_mode``, ``engine``), :class:`JacobianProduct`
(``first``, ``last``, ``factors``) and :class:`StackedBlockJacobian` (a member of a layer
group, :mod:`.group`). Every slower or approximate path taken (finite differences,
full-sequence replay, ...) emits a :class:`~spectral_hooks.errors.FallbackWarning` once per
cause. No draw from the global RNG.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..errors import OptionError, RecordingError, fallback
from .engine import METHODS, Engine, make_operator
from .function import KINDS, REPLAY_ERRORS, BlockFunction, block_function, math_sdpa
from .operator import BlockJacobian, JacobianProduct, StackedBlockJacobian
from .single_query import SingleQueryFunction, single_query_function

if TYPE_CHECKING:
    from ..anatomy import Anatomy
    from ..recording import Recording

__all__ = ["block_jacobian", "jacobian_product", "dense_block_jacobian", "block_function",
           "BlockFunction", "SingleQueryFunction", "METHODS", "KINDS", "BlockJacobian",
           "JacobianProduct", "StackedBlockJacobian"]

log: logging.Logger = logging.getLogger(__name__)
#: Largest side m * d (m positions of width d) of a Jacobian that ``dense_block_jacobian`` forms
#: without ``force=True``.
DENSE_JACOBIAN_MAX = 4096


def block_jacobian(anatomy: Anatomy, recording: Recording, layer: int, *, sample: int = 0, position: int = -1,
                   kind: str = "token", dtype: torch.dtype = torch.float64,
                   method: str = "auto", single_query: bool = True) -> BlockJacobian:
    """Block ``layer``'s Jacobian at its recorded input for batch row ``sample``.

    ``kind="token"``: d x d, J^(p) = d f(H)[p] / d H[p]; ``position``: a row index of the
    recording (must be a real, prefill token), or negative to count real tokens from the end
    (-1, the default: the last non-padding token). ``kind="sequence"``: (n d x n d) over the n
    real positions. ``method``: "auto" (linearize, else plain jvp, else finite differences with
    a warning), or force one of "linearize", "jvp", "finite_difference".
    ``single_query`` (token kind, causal models): recompute only row p, with the earlier
    positions' keys/values computed once and held fixed (blocks that take an HF ``cache``);
    used only after a check against the full-sequence block, else the full sequence is run.
    Returns a :class:`BlockJacobian`: ``.layer``, ``.sample``, ``.positions`` (the recording
    rows used), ``.kind`` and ``.single_query_mode`` ("split": batched JVPs, ``block_size``
    set; "concat"; or None).
    """
    if method not in METHODS:
        raise OptionError("method", method, f"one of {METHODS}")
    fn = block_function(anatomy, recording, layer, sample=sample, position=position, kind=kind,
                        dtype=dtype)
    where = f"p={fn.rows[0]}" if kind == "token" else f"n={len(fn.rows)}"
    # a recurrent or convolutional mixer carries the earlier tokens in a state, not a KV
    # cache: its blocks replay the full sequence by design (no fallback)
    replayable = (anatomy.causal and anatomy.layers[fn.layer].kv_cache_only
                  and fn.held_routing is None)  # a held routing is the whole sequence's
    sq = single_query_function(fn) if single_query and kind == "token" and replayable else None
    mode = None if sq is None else ("split" if sq.split else "concat")
    return make_operator(Engine(fn if sq is None else sq, method),
                          f"J[layer {fn.layer}, {kind} {where}]", kind=kind,
                          single_query_mode=mode)


def jacobian_product(anatomy: Anatomy, recording: Recording, first: int, last: int, *, sample: int = 0,
                     position: int = -1, dtype: torch.dtype = torch.float64,
                     method: str = "auto", single_query: bool = True) -> JacobianProduct:
    """P = J_last ... J_first: token Jacobians at one position, each at its own recorded input.

    Exact as the end-to-end Jacobian of layers first..last at that position for causal models
    (for bidirectional ones it is the product of per-layer token Jacobians, other tokens fixed).
    Returns a :class:`JacobianProduct` (``.first``, ``.last``, ``.sample``, ``.positions``,
    ``.factors``).
    """
    first, last = anatomy.layer_index(first), anatomy.layer_index(last)
    if first > last:
        raise OptionError("first", first, f"a layer <= last={last}",
                          hint="the product runs first..last upwards")
    missing = [l for l in range(first, last + 1) if l not in recording.layers]
    if missing:
        raise RecordingError(f"layers {missing} were not recorded (recorded: "
                             f"{list(recording.layers)}); the product needs every layer "
                             f"{first}..{last}")
    return JacobianProduct([
        block_jacobian(anatomy, recording, layer, sample=sample, position=position,
                       kind="token", dtype=dtype, method=method, single_query=single_query)
        for layer in range(first, last + 1)])


def dense_block_jacobian(anatomy: Anatomy, recording: Recording, layer: int, *, sample: int = 0, position: int = -1,
                         kind: str = "token", dtype: torch.dtype = torch.float64,
                         force: bool = False) -> Tensor:
    """The dense Jacobian (m d x m d) by ``torch.func.jacfwd`` (jacrev if forward AD fails).

    Refuses m d > 4096 unless ``force=True``.
    """
    fn = block_function(anatomy, recording, layer, sample=sample, position=position, kind=kind,
                        dtype=dtype)
    m, d = fn.x0.shape
    if m * d > DENSE_JACOBIAN_MAX and not force:
        raise OptionError("force", force, "True for a Jacobian this large",
                          hint=f"the dense Jacobian would be {m * d} x {m * d} (> {DENSE_JACOBIAN_MAX}); "
                          "pass force=True, or use block_jacobian (matrix-free)")
    try:
        with math_sdpa():
            J = torch.func.jacfwd(fn)(fn.x0)
    except REPLAY_ERRORS as err:  # no forward AD through some kernel: reverse mode
        log.info("jacfwd failed for layer %d (%s): using reverse mode", fn.layer, err)
        fallback("linearize.dense_reverse_mode",
                 f"torch.func.jacfwd failed for layer {fn.layer} ({err}): the dense Jacobian is "
                 f"built by {m * d} VJPs instead")
        engine = Engine(fn, "auto")
        J = engine.vjp(torch.eye(m * d, dtype=fn.x0.dtype, device=fn.x0.device)
                       .reshape(m * d, m, d))
        return J.reshape(m * d, m * d)  # row i = e_i^T J
    return J.reshape(m * d, m * d)
