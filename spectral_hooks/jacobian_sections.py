"""Report sections of the Jacobian view (METRICS.md sections 2 and 3).

Glue only: block Jacobians come from :mod:`spectral_hooks.linearize`, formulas from
:mod:`spectral_hooks.metrics`. Each section is a zero-argument function; the per-layer
operators and metrics are computed once and shared between sections.

    probe.analyze(jacobian={"k": 16, "positions": "last", "dense": False},
                  bottleneck=True, reinit=True, topology=True)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import pandas as pd
import torch
from tqdm.auto import tqdm

from .linalg import IdentityOperator
from .recording import map_tensors
from .metrics.bottleneck import bottleneck_table, propagation_table
from .metrics.jacobian import SCHUR_MAX_D, eigen_rows, jacobian_metrics, jacobian_row
from .metrics.trends import trends_table

log = logging.getLogger(__name__)

JACOBIAN_TREND_METRICS = ("frac_complex", "mean_abs_angle", "sym_energy", "departure",
                          "self_alignment", "top_eig_abs")
POWER_TREND_METRICS = ("gap_ratio", "gamma", "lift", "mean_cos", "erank")


@dataclass(frozen=True)
class JacobianOptions:
    """Options of the Jacobian view (``analyze(jacobian={...})``)."""

    k: int = 16
    positions: Union[str, Sequence[int]] = "last"  # "last", "all", or recording rows
    dense: bool = False
    sample: int = 0
    n_samples: int = 64
    seed: int = 0
    init_seed: int = 1  # the re-initialised model's seed (reinit=True)
    tol: float = 1e-8
    bottleneck_k: int = 32
    bottleneck_dense: Optional[bool] = None  # None: dense products when d_model <= SCHUR_MAX_D
    ablations: tuple = ("symmetric", "schur")
    progress: Optional[bool] = None  # None: a progress bar when stderr is a terminal

    @classmethod
    def parse(cls, value: Any) -> "JacobianOptions":
        if value is None or value is True or value is False:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"jacobian= takes True or a dict of options, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise TypeError(f"unknown jacobian option(s) {unknown}: choose from {sorted(known)}")
        options = cls(**{**value, "ablations": tuple(value.get("ablations", cls.ablations))})
        if not isinstance(options.k, int) or options.k < 1:
            raise ValueError(f"jacobian k must be a positive int, got {options.k!r}")
        return options


class JacobianView:
    """Per-layer operators and metrics for one probe (trained or re-initialised model)."""

    def __init__(self, probe, options: JacobianOptions, label: str) -> None:
        self.probe, self.options, self.label = probe, options, label
        anatomy = probe.anatomy
        if options.k >= anatomy.d_model and not options.dense:
            raise ValueError(f"jacobian k={options.k} must be smaller than d_model="
                             f"{anatomy.d_model} (use dense=True for every eigenvalue)")

    @property
    def layers(self) -> tuple[int, ...]:
        return self.probe.recording.layers

    def positions(self) -> list[int]:
        spec, rec = self.options.positions, self.probe.recording
        if spec == "last":
            return [-1]
        if spec == "all":
            s = self.options.sample  # real prefill positions (decode steps cannot be replayed)
            real = (rec.mask[s] != 0) & (rec.position_step[s] == 0)
            return real.nonzero().flatten().tolist()
        if isinstance(spec, str):
            raise ValueError(f"positions={spec!r}: use 'last', 'all' or a list of rows")
        return [int(p) for p in spec]

    def _bar(self, items, desc: str):
        return tqdm(items, desc=desc, disable=self.options.progress is False if
                    self.options.progress is not None else None, leave=False)

    @functools.lru_cache(maxsize=None)
    def operator(self, layer: int, position: int):
        return self.probe.jacobian(layer, position=position, sample=self.options.sample)

    @functools.lru_cache(maxsize=None)
    def dense(self, layer: int, position: int) -> torch.Tensor:
        return self.probe.dense_jacobian(layer, position=position, sample=self.options.sample)

    @functools.lru_cache(maxsize=None)
    def metrics(self, layer: int, position: int):
        o = self.options
        J = self.dense(layer, position) if o.dense else self.operator(layer, position)
        return jacobian_metrics(J, k=o.k, dense=o.dense, n_samples=o.n_samples, seed=o.seed,
                                tol=o.tol)

    def _row_position(self, layer: int, position: int) -> int:
        op = self.operator(layer, position)
        return int(op.positions[0]) if hasattr(op, "positions") else position

    @functools.lru_cache(maxsize=None)
    def table(self) -> pd.DataFrame:
        rows = []
        items = [(l, p) for l in self.layers for p in self.positions()]
        for layer, position in self._bar(items, f"Jacobian spectra ({self.label})"):
            m = self.metrics(layer, position)
            row = jacobian_row(m, layer=layer, position=self._row_position(layer, position))
            rows.append({"variant": self.label, **row})
        return pd.DataFrame(rows)

    def eigen_table(self) -> pd.DataFrame:
        rows = []
        for layer in self.layers:
            for position in self.positions():
                m = self.metrics(layer, position)
                rows += eigen_rows(m, layer=layer, position=self._row_position(layer, position))
        return pd.DataFrame(rows)

    def chain(self) -> list:
        """Token Jacobians of every layer in order at the last position (for products)."""
        layers = list(self.layers)
        if layers != list(range(layers[0], layers[-1] + 1)):
            raise ValueError(f"the bottleneck needs consecutive recorded layers, got {layers}")
        return [self.operator(layer, -1) for layer in layers]

    @property
    def dense_products(self) -> bool:
        """Exact (all d singular values) bottleneck products: the default up to SCHUR_MAX_D,
        so that every variant, schur included, is ranked from the same full spectrum."""
        choice = self.options.bottleneck_dense
        return self.probe.anatomy.d_model <= SCHUR_MAX_D if choice is None else choice

    def bottleneck(self, variant: str) -> pd.DataFrame:
        o, d = self.options, self.probe.anatomy.d_model
        if variant == "schur" and d > SCHUR_MAX_D:
            raise ValueError(f"the schur ablation needs dense Jacobians: d_model={d} is "
                             f"above the dense-mode limit SCHUR_MAX_D={SCHUR_MAX_D}")
        dense = variant == "schur" or self.dense_products
        if dense:
            ops = [self.dense(layer, -1) for layer in self._bar(self.layers, "dense Jacobians")]
        else:
            ops = self.chain()
        return bottleneck_table(ops, k=min(o.bottleneck_k, d - 2), variant=variant,
                                dense=dense, seed=o.seed)

    def amplification(self, layer: int) -> torch.Tensor:
        from .metrics.topology import amplification

        o = self.options
        if o.dense or self.dense_products:
            J = self.dense(layer, -1)
            eye = torch.eye(J.shape[0], dtype=J.dtype, device=J.device)
            return amplification(J - eye, dense=True)[0]
        J = self.operator(layer, -1)
        delta = J - IdentityOperator(J.shape[0], dtype=J.dtype, device=J.device)
        return amplification(delta, n_samples=o.n_samples, seed=o.seed)[0]


def _replay_on_fresh_model(probe, seed: int):
    """Instrument a freshly initialised copy and run it on the recorded model inputs."""
    from .anatomy.base import fresh_model

    inputs = probe.recording.model_inputs
    if not inputs or any(i is None for i in inputs):
        raise ValueError("reinit needs the model inputs of every recorded run; they are "
                         "missing (the model's forward was bypassed, e.g. TL3 generate())")
    model = fresh_model(probe.model, seed=seed)
    fresh = probe.clone_on(model)
    device = next(model.parameters()).device
    with torch.no_grad():
        for args, kwargs in map_tensors(inputs, lambda t: t.to(device)):
            model(*args, **kwargs)
    fresh.remove()
    return fresh


def jacobian_sections(analyzer: Any, *, jacobian: Any = None, bottleneck: bool = False,
                      reinit: bool = False, topology: bool = False, **extra: Any) -> dict:
    """Lazy sections: jacobian, jacobian eigenvalues (for ``spectra``), trends, bottleneck,
    propagation, topology and units."""
    if extra:
        raise TypeError(f"unknown analyze() option(s): {sorted(extra)}")
    if jacobian is None and not bottleneck and not reinit and not topology:
        return {}
    options = JacobianOptions.parse(jacobian)
    probe = analyzer.probe
    trained = JacobianView(probe, options, "trained")
    init_view = functools.lru_cache(maxsize=None)(
        lambda: JacobianView(_replay_on_fresh_model(probe, options.init_seed), options, "init"))

    def jacobian_table() -> pd.DataFrame:
        frames = [trained.table()] + ([init_view().table()] if reinit else [])
        return pd.concat(frames, ignore_index=True)

    def trends() -> pd.DataFrame:
        frames = [trends_table(trained.table(), JACOBIAN_TREND_METRICS)]
        power = analyzer.power()
        frames.append(trends_table(power, POWER_TREND_METRICS))
        return pd.concat(frames, ignore_index=True)

    def bottleneck_section() -> pd.DataFrame:
        variants = ["trained"] + list(options.ablations)
        if "schur" in variants and probe.anatomy.d_model > SCHUR_MAX_D:
            log.warning("skipping the schur ablation: d_model=%d > SCHUR_MAX_D=%d",
                        probe.anatomy.d_model, SCHUR_MAX_D)
            variants.remove("schur")
        frames = [trained.bottleneck(v) for v in variants]
        if reinit:
            frames.append(init_view().bottleneck("init"))
        return pd.concat(frames, ignore_index=True)

    def topology_tables_() -> tuple:
        from .metrics.topology import topology_tables

        rec = probe.recording
        X = {layer: rec.tokens("resid_pre", layer) for layer in trained.layers}
        g = {layer: trained.amplification(layer) for layer in trained.layers}
        g_init = ({layer: init_view().amplification(layer) for layer in trained.layers}
                  if reinit else None)
        return topology_tables(X, g, g_init_by_layer=g_init, seed=options.seed)

    topology_cached = functools.lru_cache(maxsize=None)(topology_tables_)
    sections: dict = {}
    if jacobian is not None and jacobian is not False:
        sections.update(jacobian=jacobian_table, trends=trends,
                        jacobian_spectra=trained.eigen_table)
    if bottleneck:
        sections["bottleneck"] = bottleneck_section
        sections["propagation"] = lambda: propagation_table(trained.chain(), seed=options.seed)
    if topology:
        sections["topology"] = lambda: topology_cached()[0]
        sections["units"] = lambda: topology_cached()[1]
    return sections
