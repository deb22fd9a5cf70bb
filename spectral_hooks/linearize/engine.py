"""Lazily built JVP / VJP machinery and the LinearOperator around it."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Union, cast

import torch
from torch import Tensor

from ..errors import OptionError, UnsupportedModelError, fallback
from .cuda_graphs import graphed, wanted
from .finite import checked
from .function import REPLAY_ERRORS, BlockFunction, agreement_tol, linearize, math_sdpa, plain_jvp
from .operator import BlockJacobian
from .shared import SharedJvp, disagreement, shared_block_jvp
from .single_query import SingleQueryFunction

log: logging.Logger = logging.getLogger("spectral_hooks.linearize")
METHODS = ("auto", "linearize", "jvp", "finite_difference")
#: Seed of the private generator drawing the vector each JVP method is tried on (never the
#: global torch RNG: analysing a model leaves the user's random stream alone).
CHECK_SEED = 0
# Columns per batched JVP of a split single-query block: one linearisation traced at this
# batch width serves every matmat (narrower ones are zero-padded). 32 columns cost ~3-4
# one-column JVPs on a GPT-2-small block (CPU, float64; benchmarks/jacobian_spectra.py).
BLOCK_WIDTH = 32
# Widest batched JVP graph. A call with k columns runs one pass of the narrowest graph of
# BLOCK_WIDTH * 2^i >= k columns (zero-padded: no more padding than chunks of BLOCK_WIDTH for
# k <= 64), or chunks of DENSE_WIDTH; each width is traced once (at most three graphs: 32, 64,
# 128). ``eigs(block_size=64)`` then makes one pass per application, not two or three (on a
# GPU a half or a third of the launches). At 32 rows the weight GEMMs stream each weight
# matrix per call; at 128 they run near the core's GEMM rate: a GPT-2-small block's 768
# columns (``to_dense``) take ~0.5 s instead of ~0.8 s (CPU, float64, one thread; measured
# 2026-12-04).
DENSE_WIDTH = 128


class Engine:
    """Lazily built JVP/VJP machinery for one BlockFunction."""

    def __init__(self, fn: Union[BlockFunction, SingleQueryFunction], method: str) -> None:
        if method not in METHODS:
            raise OptionError("method", method, f"one of {METHODS}")
        self.fn, self.method = fn, method
        self.x0 = fn.x0
        self.method_used: Optional[str] = None  # set when the JVP is first built
        self._jvp: Optional[Callable] = None
        self._vjp: Optional[Callable] = None
        self._blocks: dict[int, Callable] = {}  # width -> batched JVP, [width, 1, d] at once
        self._shared: dict[int, SharedJvp] = {}  # width -> its traced graph, where shared
        self._unchecked: set[int] = set()  # widths whose traced graph no product has checked
        self._vblocks: dict[int, Optional[Callable]] = {}  # width -> batched VJP (None: none)
        split = isinstance(fn, SingleQueryFunction) and fn.split
        self.block_width = BLOCK_WIDTH if split and method in ("auto", "linearize", "jvp") \
            else None
        self._vmap_ok = {"jvp": True, "vjp": True}

    # -------------------------------------------------------------- forward (matvec)
    def _build_jvp(self) -> None:
        fn, x0 = self.fn, self.x0
        order = ["linearize", "jvp", "finite_difference"] if self.method == "auto" else [
            self.method]
        gen = torch.Generator(device="cpu").manual_seed(CHECK_SEED)
        probe = torch.randn(x0.shape, generator=gen, dtype=torch.float64).to(x0)
        for method in order:
            try:
                if method == "linearize":
                    lin = linearize(fn, x0)
                    if not self._linearize_agrees(lin, probe):
                        continue  # a direct JVP (next method) is the reference
                    self._jvp = lin
                elif method == "jvp":
                    jvp = plain_jvp(fn, x0)
                    jvp(probe)
                    self._jvp = jvp
                else:
                    if self.method == "auto":
                        log.warning("forward-mode AD failed for layer %d: using a central "
                                    "finite-difference JVP", fn.layer)
                        fallback("linearize.finite_difference",
                                 f"forward-mode AD failed for layer {fn.layer}: JVPs by central "
                                 "finite differences (two block forwards each, ~1e-10 relative "
                                 "error in float64, ~eps^(2/3) otherwise)")
                    self._fd_jvp(probe)  # the block's own forward must run, at least
                    self._jvp = self._fd_jvp
                    self._vmap_ok["jvp"] = False
                self.method_used = method
                return
            except REPLAY_ERRORS as err:  # a transform or kernel refused: try the next method
                if self.method != "auto" or method == order[-1]:
                    raise self._unreplayable(method, err) from err
                log.info("JVP method %s failed for layer %d: %s", method, fn.layer, err)
                if method == "linearize":
                    fallback("linearize.plain_jvp",
                             f"torch.func.linearize failed for layer {fn.layer} ({err}): "
                             "torch.func.jvp instead (each JVP recomputes the block forward)")

    def _unreplayable(self, method: str, err: Exception) -> UnsupportedModelError:
        """The library error that ends the chain of JVP methods: which layer, which block,
        what failed and what to do."""
        fn = self.fn
        return UnsupportedModelError(
            f"layer {fn.layer} ({type(fn.block).__name__}) cannot be linearised: its replay in "
            f"{str(self.x0.dtype).replace('torch.', '')} failed ({method}: "
            f"{type(err).__name__}: {err}); a kernel of the block lacks that dtype or forward "
            "AD: load the model with attn_implementation='eager', or register an anatomy "
            "(spectral_hooks.register_anatomy) whose BlockCallConvention.replay_context "
            "switches the block to kernels that have both")

    def _linearize_agrees(self, lin: Callable[[Tensor], Tensor], probe: Tensor) -> bool:
        """Whether torch.func.linearize's traced JVP equals a direct torch.func.jvp on
        ``probe`` (to rounding: agreement_tol): its trace can bake in a wrong graph (DeepSeek-V3
        blocks, torch 2.13: 1e-3 off). One direct JVP per layer; a forced
        ``method="linearize"`` that disagrees raises instead of returning wrong products."""
        fn, x0 = self.fn, self.x0
        got = lin(probe)
        want = plain_jvp(fn, x0)(probe)
        err = float((got - want).abs().max()) / max(float(want.abs().max()), 1e-300)
        if err <= agreement_tol(x0.dtype):
            return True
        why = (f"torch.func.linearize disagrees with torch.func.jvp for layer {fn.layer} "
               f"({err:.1e} relative)")
        if self.method != "auto":
            raise OptionError("method", self.method, "'auto' or 'jvp' for this block",
                              hint=why + ": its traced JVP graph is wrong")
        fallback("linearize.plain_jvp", f"{why}: torch.func.jvp instead (each JVP recomputes "
                 "the block forward)")
        return False

    def _fd_jvp(self, v: Tensor) -> Tensor:
        x0 = self.x0
        vmax = float(v.abs().max())
        if vmax == 0:
            return torch.zeros_like(x0)
        eps = torch.finfo(x0.dtype).eps
        h = eps ** (1 / 3) * max(1.0, float(x0.abs().max())) / vmax
        with torch.no_grad():
            return (self.fn(x0 + h * v) - self.fn(x0 - h * v)) / (2 * h)

    def jvp(self, V: Tensor) -> Tensor:
        """V [m, d] or [k, m, d] (batched) -> J V."""
        if self.block_width:
            # every product runs a shared traced graph (shared.py: one trace per block
            # structure, not a torch.func.linearize per layer: GPT-2-small 0.03-0.07 s a layer
            # instead of 0.5-1.5 s, the same JVP bit for bit); one column (a Krylov step) at
            # width 1, more at BLOCK_WIDTH * 2^i
            return self._block_jvp(V[None])[0] if V.ndim == 2 else self._block_jvp(V)
        if self._jvp is None:
            self._build_jvp()
        assert self._jvp is not None  # built above
        if V.ndim == 2:
            return self._jvp(V)
        return self._batched("jvp", self._jvp, V)

    def _build_block(self, W: int, trace: str = "shared") -> Callable:
        """Linearise the single-query block on a batch of W copies of its input: the c query
        rows run as one matrix-matrix pass (see single_query.py). ``trace``: "shared" (the
        graph of its structure), "own" (this block alone, the shared one having disagreed) or
        "linearize" (``torch.func.linearize``, the traced graphs having failed)."""
        fn = cast(SingleQueryFunction, self.fn)  # block_width is set: single query
        X0 = self.x0.expand(W, *self.x0.shape).contiguous()
        if self.method not in ("auto", "linearize"):
            return plain_jvp(fn.batched, X0)
        if trace != "linearize":
            try:
                return shared_block_jvp(fn, W, own=trace == "own")
            except REPLAY_ERRORS as err:  # trace this block on its own
                self._report_linearize(err)
        return linearize(fn.batched, X0)

    def _report_linearize(self, err: Exception) -> None:
        log.info("shared JVP graph failed for layer %d (%s): torch.func.linearize",
                 self.fn.layer, err)
        fallback("linearize.own_trace",
                 f"the shared traced JVP graph failed for layer {self.fn.layer} ({err}): "
                 "torch.func.linearize of this block alone (a slower build)")

    def _width(self, k: int) -> int:
        W = 1 if k == 1 else self.block_width
        assert W is not None  # only with a block width
        while W < min(k, DENSE_WIDTH):  # a wider block (block Krylov, to_dense): one pass
            W *= 2
        return W

    @staticmethod
    def _in_passes(block: Callable, V: Tensor, W: int) -> Tensor:
        """block applied to V [k, ...] in passes of W rows (the last one zero-padded)."""
        if V.shape[0] == W:  # one full pass (block Krylov's usual application): no copies
            return block(V)
        out = []
        for i in range(0, V.shape[0], W):
            chunk = V[i:i + W]
            c = chunk.shape[0]
            if c < W:
                chunk = torch.cat([chunk, chunk.new_zeros((W - c, *chunk.shape[1:]))])
            out.append(block(chunk)[:c])
        return out[0] if len(out) == 1 else torch.cat(out)

    def _block_jvp(self, V: Tensor) -> Tensor:
        W = self._width(V.shape[0])
        block = self._blocks.get(W)
        if block is None:
            try:
                block = self._jvp_block(W)
            except REPLAY_ERRORS as err:  # fall back to vmapped one-row JVPs
                self._no_batched_products(err)
                return self.jvp(V)
        out = self._in_passes(block, V, W)
        return self._checked(W, V, out) if W in self._unchecked else out

    def _checked(self, W: int, V: Tensor, out: Tensor) -> Tensor:
        """``out`` = the first products J V through the traced graph of width W, checked
        against a direct JVP (shared.disagreement); where the shared graph disagrees, the
        block gets its own trace and they are computed again (checked in turn)."""
        try:
            err = disagreement(cast(SingleQueryFunction, self.fn), V, out)
        except REPLAY_ERRORS as why:  # no direct JVP of this block: no forward AD through it
            self._unchecked.discard(W)
            del self._blocks[W], self._shared[W]
            self._no_batched_products(why)
            return self.jvp(V)
        if err is None:  # V c = 0: nothing checked yet
            return out
        self._unchecked.discard(W)
        if err <= agreement_tol(self.x0.dtype):
            return out
        own = self._shared[W].own
        del self._blocks[W], self._shared[W]  # (a VJP built from it passed its own check)
        if own:  # this block's own trace disagrees too: torch.func.linearize of it
            self._report_linearize(RuntimeError(
                f"traced JVP graph of layer {self.fn.layer} disagrees with torch.func.jvp "
                f"({err:.1e})"))
        else:
            log.info("shared JVP graph disagrees for layer %d (%.1e): tracing it on its own",
                     self.fn.layer, err)
            fallback("linearize.own_trace",
                     f"the shared traced JVP graph disagrees for layer {self.fn.layer} "
                     f"({err:.1e}): this block is traced on its own (a slower build)")
        try:
            block = self._jvp_block(W, "linearize" if own else "own")
        except REPLAY_ERRORS as why:
            self._no_batched_products(why)
            return self.jvp(V)
        out = self._in_passes(block, V, W)
        return self._checked(W, V, out) if W in self._unchecked else out

    def _no_batched_products(self, err: Exception) -> None:
        """Report it and use one query row per product from now on (JVP and VJP)."""
        log.info("batched JVP unavailable for layer %d (%s)", self.fn.layer, err)
        fallback("linearize.no_batched_jvp",
                 f"batched JVPs unavailable for layer {self.fn.layer} ({err}): one query row "
                 "per JVP (several times slower per column)")
        self.block_width = None

    def _jvp_block(self, W: int, trace: str = "shared") -> Callable:
        block = self._build_block(W, trace)
        if isinstance(block, SharedJvp):
            self._shared[W] = block
            self._unchecked.add(W)
        if wanted(self.x0):
            block = graphed(block, self.x0.new_zeros((W, *self.x0.shape)),
                            what=f"JVP of layer {self.fn.layer} ({W} columns)")
        self._blocks[W] = block
        self.method_used = self.method_used or (
            "linearize" if self.method in ("auto", "linearize") else "jvp")
        return block

    # -------------------------------------------------------------- reverse (rmatvec)
    def vjp(self, U: Tensor) -> Tensor:
        """U [m, d] or [k, m, d] (batched) -> the VJP U J (as :meth:`jvp`'s shapes)."""
        if self.block_width and self.method in ("auto", "linearize"):
            out = self._block_vjp(U[None] if U.ndim == 2 else U)
            if out is not None:
                return out[0] if U.ndim == 2 else out
        if self._vjp is None:
            self._build_vjp()
        assert self._vjp is not None  # built above
        if U.ndim == 2:
            return self._vjp(U)
        return self._batched("vjp", self._vjp, U)

    def _block_vjp(self, U: Tensor) -> Optional[Tensor]:
        """J^T U [k, m, d] by the transposed traced graph (shared.SharedJvp.transpose: plain
        aten ops, no autograd engine; a CUDA graph replay on GPUs); None where there is none."""
        W = self._width(U.shape[0])
        if W not in self._vblocks:
            self._vblocks[W] = self._build_vblock(W)
        vblock = self._vblocks[W]
        return None if vblock is None else self._in_passes(vblock, U, W)

    def _build_vblock(self, W: int) -> Optional[Callable]:
        if W not in self._blocks:
            try:
                self._jvp_block(W)
            except REPLAY_ERRORS as err:  # no batched JVP: the VJP closure
                self._no_batched_products(err)
                return None
        shared = self._shared.get(W)
        if shared is None:
            return None
        try:
            vblock = shared.transpose()
        except REPLAY_ERRORS as err:
            log.info("traced VJP graph failed for layer %d (%s): torch.func.vjp", self.fn.layer,
                     err)
            fallback("linearize.own_vjp",
                     f"the transposed JVP graph failed for layer {self.fn.layer} ({err}): VJPs "
                     "by torch.func.vjp of the block (slower per column)")
            return None
        if wanted(self.x0):
            vblock = graphed(vblock, self.x0.new_zeros((W, *self.x0.shape)),
                             what=f"VJP of layer {self.fn.layer} ({W} columns)")
        return vblock

    def _build_vjp(self) -> None:
        try:
            with math_sdpa():
                vjp_fn = torch.func.vjp(self.fn, self.x0)[1]
            self._vjp = lambda u: vjp_fn(u)[0]
            return
        except REPLAY_ERRORS as err:  # e.g. an autograd.Function without setup_context
            log.info("torch.func.vjp failed for layer %d (%s): using torch.autograd", self.fn.layer,
                     err)
            fallback("linearize.autograd_vjp",
                     f"torch.func.vjp failed for layer {self.fn.layer} ({err}): VJPs by "
                     "torch.autograd, one column at a time")
        x = self.x0.clone().requires_grad_(True)
        with torch.enable_grad(), math_sdpa():
            y = self.fn(x)
        self._vmap_ok["vjp"] = False
        self._vjp = lambda u: torch.autograd.grad(y, x, u, retain_graph=True)[0]

    def _batched(self, which: str, f: Callable, V: Tensor) -> Tensor:
        if V.shape[0] == 1:  # a Krylov step: vmap's overhead would double the cost
            return f(V[0])[None]
        if self._vmap_ok[which]:
            try:
                with math_sdpa():
                    return torch.vmap(f)(V)
            except REPLAY_ERRORS as err:  # vmap cannot batch some op of this block
                log.info("vmap over the %s failed (%s): applying column by column", which, err)
                fallback(f"linearize.no_vmap_{which}",
                         f"torch.vmap over the {which} failed for layer {self.fn.layer} "
                         f"({err}): columns applied one at a time (slower)")
                self._vmap_ok[which] = False
        return torch.stack([f(v) for v in V])


def make_operator(engine: Engine, name: str, *, kind: str,
                   single_query_mode: Optional[str]) -> BlockJacobian:
    """The :class:`BlockJacobian` of ``engine``'s block function: an (m d x m d)
    operator on flattened rows (matvec = JVP, rmatvec = VJP, complex vectors by parts) that
    names its layer, sample, positions, ``kind`` and ``single_query_mode``.
    """
    fn = engine.fn
    m, d = fn.x0.shape
    n = m * d
    dtype = fn.x0.dtype

    def as_rows(x: Tensor) -> Tensor:
        return x.to(dtype).reshape(m, d)

    at: dict[str, Any] = dict(layer=fn.layer, sample=fn.sample, positions=list(fn.rows))

    made: list[BlockJacobian] = []  # the operator, once built (its caller_checks_finite)

    def cplx(f: Callable, x: Tensor, what: str) -> Tensor:
        out = torch.complex(f(x.real), f(x.imag)) if x.is_complex() else f(x)
        if made and made[0].caller_checks_finite:
            # a solver tests the products on the device (one sync per Krylov expansion, not
            # one per application) and raises BlockJacobian.nonfinite_error: the same error
            return out
        return checked(out, what=what, **at)  # overflow inside the replay: named here

    def matvec(x: Tensor) -> Tensor:
        return cplx(lambda v: engine.jvp(as_rows(v)).reshape(n), x, "JVP")

    def rmatvec(y: Tensor) -> Tensor:
        return cplx(lambda u: engine.vjp(as_rows(u)).reshape(n), y, "VJP")

    def matmat(X: Tensor) -> Tensor:
        return cplx(lambda V: engine.jvp(V.to(dtype).T.reshape(-1, m, d)).reshape(-1, n).T, X,
                    "JVP")

    def rmatmat(Y: Tensor) -> Tensor:
        return cplx(lambda U: engine.vjp(U.to(dtype).T.reshape(-1, m, d)).reshape(-1, n).T, Y,
                    "VJP")

    op = BlockJacobian(n, matvec=matvec, rmatvec=rmatvec, matmat=matmat, rmatmat=rmatmat,
                       dtype=dtype, device=fn.x0.device, name=name, layer=fn.layer,
                       sample=fn.sample, positions=fn.rows, kind=kind,
                       single_query_mode=single_query_mode, engine=engine,
                       block_size=engine.block_width)
    made.append(op)
    return op
