"""Synthetic, realistic report tables (numpy only) shared by the report tests."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from spectral_hooks.report import Report


def power_table(rng: np.random.Generator, n_layers: int, d: int = 64, n_tokens: int = 40) -> pd.DataFrame:
    rows = []
    for layer in range(n_layers):
        lam = rng.normal(size=2) * 2
        cplx = layer % 3 == 1
        l1 = complex(abs(lam[0]) + 1, abs(lam[1]) if cplx else 0.0)
        a2 = abs(l1) * rng.uniform(0.2, 0.95)
        null = math.sqrt(2 / (math.pi * d)) * (1.2 if cplx else 1.0)
        gamma_in = null * rng.uniform(1, 3)
        gamma = min(1.0, gamma_in * rng.uniform(1, 2.5))
        k = int(rng.integers(0, n_tokens + 1))
        rows.append(dict(
            layer=layer, lambda1_real=l1.real, lambda1_imag=l1.imag, abs_lambda1=abs(l1),
            abs_lambda2=a2, gap_ratio=a2 / abs(l1), lambda1_is_complex=cplx, gamma_in=gamma_in,
            gamma=gamma, gamma_null=null, lift=gamma / null, gamma2=min(1.0, gamma * 1.3),
            gamma2_null=null * 1.4, rho=k / n_tokens, rho_pvalue=float(rng.uniform(0, 0.2)),
            n_tokens=n_tokens, mean_cos=float(rng.uniform(0, 1)), collapse_residual=float(rng.uniform(0, 1)),
            erank=float(rng.uniform(5, d)),
        ))
    return pd.DataFrame(rows)


def spectra_table(rng: np.random.Generator, n_layers: int, d: int = 24, k: int = 8) -> pd.DataFrame:
    rows = []
    for layer in range(n_layers):
        ev = np.linalg.eigvals(rng.normal(size=(d, d)) / math.sqrt(d) * (0.5 + 0.2 * layer))
        ev = ev[np.argsort(-np.abs(ev))]
        for i, z in enumerate(ev):
            rows.append(dict(source="F", layer=layer, position=-1, index=i, real=z.real, imag=z.imag, abs=abs(z)))
        ev = np.linalg.eigvals(np.eye(d) + rng.normal(size=(d, d)) / math.sqrt(d) * 0.3)
        ev = ev[np.argsort(-np.abs(ev))][:k]
        for i, z in enumerate(ev):
            rows.append(dict(source="jacobian", layer=layer, position=7, index=i, real=z.real, imag=z.imag, abs=abs(z)))
    return pd.DataFrame(rows)


def jacobian_table(rng: np.random.Generator, n_layers: int, positions=(5, 7)) -> pd.DataFrame:
    rows = []
    for variant in ("trained", "init"):
        for layer in range(n_layers):
            for p in positions:
                rows.append(_jacobian_row(rng, variant, layer, p, n_layers))
    return pd.DataFrame(rows)


def _jacobian_row(rng, variant: str, layer: int, p: int, n_layers: int) -> dict:
    sym = 0.5 + 0.4 * layer / max(n_layers - 1, 1) if variant == "trained" else 0.55
    return dict(
        variant=variant, layer=layer, position=p, frac_complex=float(rng.uniform(0.3, 1)),
        frac_complex_null=0.9, mean_abs_angle=float(rng.uniform(0, 1.5)), sym_energy=sym,
        departure=float(rng.uniform(0, 1)), departure_is_bound=True,
        self_alignment=float(rng.uniform(0, 1)), top_eig_abs=float(rng.uniform(1, 3)),
        n_matvecs=int(rng.integers(50, 200)),
    )


def bottleneck_table(rng: np.random.Generator, n_layers: int) -> pd.DataFrame:
    rows = []
    for variant, rate in (("trained", 0.6), ("init", 0.95), ("symmetric", 0.8), ("schur", 0.85)):
        for depth in range(1, n_layers + 1):
            er = 60 * rate**depth
            rows.append(dict(variant=variant, depth=depth, erank=er, participation_ratio=er * 0.7,
                             stable_rank=er * 0.3, surviving=max(1, int(er * 1.5))))
    return pd.DataFrame(rows)


def topology_tables(rng: np.random.Generator, n_layers: int, d: int = 16) -> tuple[pd.DataFrame, pd.DataFrame]:
    topo, units = [], []
    for layer in range(n_layers):
        topo.append(dict(layer=layer, n_communities=int(rng.integers(2, 8)), modularity=float(rng.uniform(0.1, 0.7)),
                         coupling_rho=float(rng.uniform(-1, 1)), coupling_pvalue=float(rng.uniform(0, 0.2)),
                         coupling_rho_init=float(rng.uniform(-0.2, 0.2)),
                         coupling_rho_shuffled=float(rng.uniform(-0.2, 0.2))))
        for u in range(d):
            units.append(dict(layer=layer, unit=u, community=int(rng.integers(0, 4)),
                              bridge_score=float(rng.uniform(0, 1)), amplification=float(rng.gamma(2.0))))
    return pd.DataFrame(topo), pd.DataFrame(units)


def trends_table(rng: np.random.Generator) -> pd.DataFrame:
    return pd.DataFrame({"metric": ["frac_complex", "sym_energy", "departure"],
                         "spearman_rho": rng.uniform(-1, 1, 3), "pvalue": rng.uniform(0, 0.1, 3)})


def make_sections(seed: int = 0, n_layers: int = 6) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    topo, units = topology_tables(rng, n_layers)
    return {
        "power": power_table(rng, n_layers),
        "spectra": spectra_table(rng, n_layers),
        "jacobian": jacobian_table(rng, n_layers),
        "trends": trends_table(rng),
        "bottleneck": bottleneck_table(rng, n_layers),
        "topology": topo,
        "units": units,
    }


def make_report(seed: int = 0, n_layers: int = 6, **meta) -> Report:
    metadata = {"model": "synthetic-tiny", "config_hash": "abc123", "options": {"k": 8, "dense": False},
                "inputs": {"n_texts": 3, "n_tokens": 40}, "timings_s": {"power": 0.12}, **meta}
    return Report(make_sections(seed, n_layers), metadata)


# Fixtures hand out the factories themselves, so tests never import this conftest by name
# (which would break under pytest's importlib import mode or with other conftest.py files).
@pytest.fixture(name="make_report", scope="session")
def make_report_fixture():
    return make_report


@pytest.fixture(name="make_sections", scope="session")
def make_sections_fixture():
    return make_sections


EVIL = '<script>alert("x")</script>&'


@pytest.fixture(name="rendered_page", scope="session")
def rendered_page_fixture() -> str:
    """The full HTML report of a synthetic report with hostile strings, rendered once per session."""
    from spectral_hooks.report.html import render_html

    rep = make_report(model=EVIL, notes={"k": EVIL})
    rep.power["layer_label"] = EVIL  # a string cell
    return render_html(rep)
