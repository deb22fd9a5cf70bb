"""Lazily built JVP / VJP machinery and the LinearOperator around it."""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
from torch import Tensor

from ..linalg import LinearOperator
from .function import BlockFunction, _math_sdpa

log = logging.getLogger("spectral_hooks.linearize")
METHODS = ("auto", "linearize", "jvp", "finite_difference")


class _Engine:
    """Lazily built JVP/VJP machinery for one BlockFunction."""

    def __init__(self, fn: BlockFunction, method: str) -> None:
        if method not in METHODS:
            raise ValueError(f"method={method!r}: choose from {METHODS}")
        self.fn, self.method = fn, method
        self.x0 = fn.x0
        self._jvp: Optional[Callable] = None
        self._vjp: Optional[Callable] = None
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
                    def jvp(v, fn=fn, x0=x0):
                        with _math_sdpa():
                            return torch.func.jvp(fn, (x0,), (v,))[1]
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
        if self._jvp is None:
            self._build_jvp()
        if V.ndim == 2:
            return self._jvp(V)
        return self._batched("jvp", self._jvp, V)

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
                        dtype=dtype, device=fn.x0.device, name=name)
    op.layer, op.sample, op.positions, op.engine = fn.layer, fn.sample, fn.positions, engine
    return op
