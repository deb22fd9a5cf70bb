"""Lazily built JVP / VJP machinery and the LinearOperator around it."""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
from torch import Tensor

from ..linalg import LinearOperator
from .function import BlockFunction, _math_sdpa, plain_jvp
from .shared import shared_block_jvp

log = logging.getLogger("spectral_hooks.linearize")
METHODS = ("auto", "linearize", "jvp", "finite_difference")
# Columns per batched JVP of a split single-query block: one linearisation traced at this
# batch width serves every matmat (narrower ones are zero-padded). 32 columns cost ~3-4
# one-column JVPs on a GPT-2-small block (CPU, float64; benchmarks/jacobian_spectra.py).
BLOCK_WIDTH = 32


class _Engine:
    """Lazily built JVP/VJP machinery for one BlockFunction."""

    def __init__(self, fn: BlockFunction, method: str) -> None:
        if method not in METHODS:
            raise ValueError(f"method={method!r}: choose from {METHODS}")
        self.fn, self.method = fn, method
        self.x0 = fn.x0
        self._jvp: Optional[Callable] = None
        self._vjp: Optional[Callable] = None
        self._block: Optional[Callable] = None  # batched JVP, [BLOCK_WIDTH, 1, d] at once
        self.block_width = BLOCK_WIDTH if getattr(fn, "split", False) and method in (
            "auto", "linearize", "jvp") else None
        self._vmap_ok = {"jvp": True, "vjp": True}

    # -------------------------------------------------------------- forward (matvec)
    def _build_jvp(self) -> None:
        fn, x0 = self.fn, self.x0
        order = ["linearize", "jvp", "finite_difference"] if self.method == "auto" else [
            self.method]
        probe = torch.randn_like(x0)
        for method in order:
            try:
                if method == "linearize":
                    with _math_sdpa():
                        _, lin = torch.func.linearize(fn, x0)
                    lin(probe)
                    self._jvp = lin
                elif method == "jvp":
                    jvp = plain_jvp(fn, x0)
                    jvp(probe)
                    self._jvp = jvp
                else:
                    if self.method == "auto":
                        log.warning("forward-mode AD failed for layer %d: using a central "
                                    "finite-difference JVP", fn.layer)
                    self._jvp = self._fd_jvp
                    self._vmap_ok["jvp"] = False
                self.method_used = method
                return
            except Exception as err:  # noqa: BLE001 - try the next method
                if self.method != "auto":
                    raise
                log.info("JVP method %s failed for layer %d: %s", method, fn.layer, err)

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
        if V.ndim == 3 and V.shape[0] > 1 and self.block_width:
            return self._block_jvp(V)
        if self._jvp is None:
            self._build_jvp()
        if V.ndim == 2:
            return self._jvp(V)
        return self._batched("jvp", self._jvp, V)

    def _build_block(self) -> None:
        """Linearise the single-query block on a batch of BLOCK_WIDTH copies of its input:
        the c query rows run as one matrix-matrix pass (see single_query.py)."""
        fn, W = self.fn, self.block_width
        X0 = self.x0.expand(W, *self.x0.shape).contiguous()
        if self.method in ("auto", "linearize"):
            try:
                self._block = shared_block_jvp(fn, W)
                return
            except Exception as err:  # noqa: BLE001 - trace this block on its own
                log.info("shared JVP graph failed for layer %d (%s): torch.func.linearize",
                         fn.layer, err)
            with _math_sdpa():
                _, self._block = torch.func.linearize(fn.batched, X0)
        else:
            self._block = plain_jvp(fn.batched, X0)

    def _block_jvp(self, V: Tensor) -> Tensor:
        if self._block is None:
            try:
                self._build_block()
            except Exception as err:  # noqa: BLE001 - fall back to vmapped one-row JVPs
                log.info("batched JVP unavailable for layer %d (%s)", self.fn.layer, err)
                self.block_width = None
                return self.jvp(V)
        W, k = self.block_width, V.shape[0]
        out = []
        for i in range(0, k, W):
            chunk = V[i:i + W]
            c = chunk.shape[0]
            if c < W:
                chunk = torch.cat([chunk, chunk.new_zeros((W - c, *chunk.shape[1:]))])
            out.append(self._block(chunk)[:c])
        return torch.cat(out)

    # -------------------------------------------------------------- reverse (rmatvec)
    def vjp(self, U: Tensor) -> Tensor:
        if self._vjp is None:
            self._build_vjp()
        if U.ndim == 2:
            return self._vjp(U)
        return self._batched("vjp", self._vjp, U)

    def _build_vjp(self) -> None:
        try:
            with _math_sdpa():
                _, vjp_fn = torch.func.vjp(self.fn, self.x0)
            self._vjp = lambda u: vjp_fn(u)[0]
            return
        except Exception as err:  # noqa: BLE001 - e.g. an autograd.Function without setup_context
            log.info("torch.func.vjp failed for layer %d (%s): using torch.autograd", self.fn.layer,
                     err)
        x = self.x0.clone().requires_grad_(True)
        with torch.enable_grad(), _math_sdpa():
            y = self.fn(x)
        self._vmap_ok["vjp"] = False
        self._vjp = lambda u: torch.autograd.grad(y, x, u, retain_graph=True)[0]

    def _batched(self, which: str, f: Callable, V: Tensor) -> Tensor:
        if V.shape[0] == 1:  # a Krylov step: vmap's overhead would double the cost
            return f(V[0])[None]
        if self._vmap_ok[which]:
            try:
                with _math_sdpa():
                    return torch.vmap(f)(V)
            except Exception as err:  # noqa: BLE001
                log.info("vmap over the %s failed (%s): applying column by column", which, err)
                self._vmap_ok[which] = False
        return torch.stack([f(v) for v in V])


def _make_operator(engine: _Engine, name: str) -> LinearOperator:
    fn = engine.fn
    m, d = fn.x0.shape
    n = m * d
    dtype = fn.x0.dtype

    def as_rows(x: Tensor) -> Tensor:
        return x.to(dtype).reshape(m, d)

    def cplx(f: Callable, x: Tensor) -> Tensor:
        if x.is_complex():
            return torch.complex(f(x.real), f(x.imag))
        return f(x)

    def matvec(x: Tensor) -> Tensor:
        return cplx(lambda v: engine.jvp(as_rows(v)).reshape(n), x)

    def rmatvec(y: Tensor) -> Tensor:
        return cplx(lambda u: engine.vjp(as_rows(u)).reshape(n), y)

    def matmat(X: Tensor) -> Tensor:
        return cplx(lambda V: engine.jvp(V.to(dtype).T.reshape(-1, m, d)).reshape(-1, n).T, X)

    def rmatmat(Y: Tensor) -> Tensor:
        return cplx(lambda U: engine.vjp(U.to(dtype).T.reshape(-1, m, d)).reshape(-1, n).T, Y)

    op = LinearOperator((n, n), matvec=matvec, rmatvec=rmatvec, matmat=matmat, rmatmat=rmatmat,
                        dtype=dtype, device=fn.x0.device, name=name,
                        block_size=engine.block_width)
    op.layer, op.sample, op.positions, op.engine = fn.layer, fn.sample, fn.positions, engine
    return op
