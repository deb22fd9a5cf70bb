"""The Jacobian view of one subject: block operators, dense Jacobians and their metrics.

    >>> view = JacobianView(subject, options.jacobian_options)     # doctest: +SKIP
    >>> view.table()                                                # doctest: +SKIP
       variant  layer  position  frac_complex ...

Every operator, dense matrix and metric is computed once per state of the weights and the
recording (``subject.memo``) and shared by the sections that need it (jacobian, spectra,
trends, bottleneck, topology).
"""

from __future__ import annotations

from typing import Iterable, Union

import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..linalg import IdentityOperator, LinearOperator
from ..linearize import block_jacobian, dense_block_jacobian
from ..metrics.jacobian import (
    SCHUR_MAX_D,
    JacobianMetrics,
    eigen_rows,
    jacobian_metrics,
    jacobian_row,
)
from ..metrics.topology import amplification
from .options import JacobianOptions
from .subject import Subject


class JacobianView:
    """Per-layer block Jacobians of ``subject`` under ``options`` (computed on demand)."""

    def __init__(self, subject: Subject, options: JacobianOptions) -> None:
        d = subject.anatomy.d_model
        if options.k >= d and not options.dense:
            from ..errors import OptionError

            raise OptionError("jacobian.k", options.k, f"an int below d_model={d}",
                              hint="use dense=True for every eigenvalue")
        self.subject, self.options = subject, options
        self.label = subject.label

    @property
    def layers(self) -> tuple[int, ...]:
        return self.subject.layers

    def positions(self) -> list[int]:
        return self.subject.positions(self.options.positions, self.options.sample)

    def bar(self, items: Iterable, desc: str) -> Iterable:
        progress = self.options.progress
        return tqdm(items, desc=desc, leave=False,
                    disable=None if progress is None else not progress)

    def _memo(self, key: tuple, compute):
        return self.subject.memo(("jacobian", self.options.sample) + key, compute)

    def operator(self, layer: int, position: int) -> LinearOperator:
        s = self.subject
        return self._memo(("operator", layer, position), lambda: block_jacobian(
            s.anatomy, s.recording, layer, position=position, sample=self.options.sample))

    def dense(self, layer: int, position: int) -> Tensor:
        s = self.subject
        return self._memo(("dense", layer, position), lambda: dense_block_jacobian(
            s.anatomy, s.recording, layer, position=position, sample=self.options.sample))

    def metrics(self, layer: int, position: int) -> JacobianMetrics:
        o = self.options

        def compute() -> JacobianMetrics:
            J = self.dense(layer, position) if o.dense else self.operator(layer, position)
            return jacobian_metrics(J, k=o.k, dense=o.dense, n_samples=o.n_samples,
                                    seed=o.seed, tol=o.tol)
        return self._memo(("metrics", layer, position, o.k, o.dense, o.n_samples, o.seed, o.tol),
                          compute)

    def row_position(self, layer: int, position: int) -> int:
        """The recording row a position spec resolves to (-1: the last real token)."""
        return int(self.operator(layer, position).positions[0])

    def table(self) -> pd.DataFrame:
        def compute() -> pd.DataFrame:
            rows = []
            items = [(l, p) for l in self.layers for p in self.positions()]
            for layer, position in self.bar(items, f"Jacobian spectra ({self.label})"):
                row = jacobian_row(self.metrics(layer, position), layer=layer,
                                   position=self.row_position(layer, position))
                rows.append({"variant": self.label, **row})
            return pd.DataFrame(rows)
        o = self.options
        return self._memo(("table", o.positions, o.k, o.dense, o.n_samples, o.seed, o.tol),
                          compute)

    def eigen_table(self) -> pd.DataFrame:
        rows = []
        for layer in self.layers:
            for position in self.positions():
                rows += eigen_rows(self.metrics(layer, position), layer=layer,
                                   position=self.row_position(layer, position))
        return pd.DataFrame(rows)

    def chain(self) -> list[LinearOperator]:
        """Token Jacobians of every recorded layer in order at the last position."""
        layers = list(self.layers)
        if layers != list(range(layers[0], layers[-1] + 1)):
            from ..errors import RecordingError

            raise RecordingError(f"the bottleneck needs consecutive recorded layers, got "
                                 f"{layers}: instrument with layers=None")
        return [self.operator(layer, -1) for layer in layers]

    @property
    def dense_products(self) -> bool:
        """Exact (all d singular values) bottleneck products: the default up to SCHUR_MAX_D,
        so that every variant, schur included, is ranked from the same full spectrum."""
        choice = self.options.bottleneck_dense
        return self.subject.anatomy.d_model <= SCHUR_MAX_D if choice is None else choice

    def dense_chain(self) -> list[Tensor]:
        return [self.dense(layer, -1) for layer in self.bar(self.layers, "dense Jacobians")]

    def amplification(self, layer: int) -> Tensor:
        o = self.options
        if o.dense or self.dense_products:
            J = self.dense(layer, -1)
            eye = torch.eye(J.shape[0], dtype=J.dtype, device=J.device)
            return amplification(J - eye, dense=True)[0]
        J: Union[LinearOperator, Tensor] = self.operator(layer, -1)
        delta = J - IdentityOperator(J.shape[0], dtype=J.dtype, device=J.device)
        return amplification(delta, n_samples=o.n_samples, seed=o.seed)[0]


def jacobian_view(subject: Subject, options: JacobianOptions) -> JacobianView:
    return JacobianView(subject, options)


def jacobian_section(subject: Subject, options, init: Subject | None = None) -> pd.DataFrame:
    """One row per (variant, layer, position); ``init`` adds the re-initialised model's rows."""
    o = options.jacobian_options
    frames = [JacobianView(subject, o).table()]
    if init is not None:
        frames.append(JacobianView(init, o).table())
    return pd.concat(frames, ignore_index=True)
