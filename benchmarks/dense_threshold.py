"""Calibrates ``DENSE_AUTO_MAX_D`` (spectral_hooks/analysis/jacobian.py): the d_model up to which
``JacobianOptions(dense=None)`` computes the Jacobian view exactly.

    python benchmarks/dense_threshold.py                  # ~8 min on 2 cores
    python benchmarks/dense_threshold.py --widths 128 256  # a subset

For each width d: a 1-layer GPT-2 config (d/64 heads), a float32 model, one 32-token sequence;
the last token's block Jacobian, per layer (what one row of ``report.jacobian`` costs):

* exact: the full J from d batched single-query JVPs (``BlockJacobian.to_dense``), then
  ``jacobian_metrics(J, dense=True, k=16)`` (dense eig, SVD, norms);
* matrix-free: ``jacobian_metrics(op, k=16, n_samples=64, tol=1e-8)`` (eigs, two svds,
  Hutchinson probes), on a fresh operator.

Timed interleaved (exact, matrix-free, exact, ...), one torch thread, median of ``--rounds``;
the Monte Carlo null of the top-k (the same in both) is computed before timing. The threshold
is a constant chosen from this table once, never a timing taken at run time: the widest power
of two where the exact computation costs at most ~0.6x the matrix-free run (a margin for the
Krylov solver getting cheaper, and for the d^3 growth of the dense eig and of memory beyond).
2026-12-03 (2 shared cores, a golden-report run on the other core): ratio 0.33 / 0.33 / 0.34 /
0.54 / 0.75 at d = 128 / 256 / 512 / 1024 / 1536 -> DENSE_AUTO_MAX_D = 1024 (crossover near
d ~ 2000 by extrapolation). Writes benchmarks/results/dense_threshold.md.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2Model

import spectral_hooks as sh
from spectral_hooks.linearize import block_jacobian
from spectral_hooks.metrics.jacobian import frac_complex_top_null, jacobian_metrics

K, N_SAMPLES, TOL, TOKENS = 16, 64, 1e-8, 32


def _recorded(d: int):
    config = GPT2Config(n_embd=d, n_head=max(1, d // 64), n_layer=1, n_positions=64,
                        vocab_size=100)
    torch.manual_seed(0)
    model = GPT2Model(config).eval()
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, TOKENS)))
    return probe


def _exact(probe) -> float:
    start = time.perf_counter()
    op = block_jacobian(probe.anatomy, probe.recording, 0)
    jacobian_metrics(op.to_dense(), k=K, dense=True)
    return time.perf_counter() - start


def _matrix_free(probe) -> tuple[float, int]:
    start = time.perf_counter()
    op = block_jacobian(probe.anatomy, probe.recording, 0)
    m = jacobian_metrics(op, k=K, n_samples=N_SAMPLES, tol=TOL)
    return time.perf_counter() - start, m.n_matvecs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", type=int, nargs="*", default=[128, 256, 512, 1024, 1536])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for d in args.widths:
        probe = _recorded(d)
        frac_complex_top_null(d, K) if d <= 512 else None
        ex, mf, mv = [], [], 0
        for _ in range(args.rounds):
            ex.append(_exact(probe))
            t, mv = _matrix_free(probe)
            mf.append(t)
        rows.append((d, statistics.median(ex), statistics.median(mf), mv))
        print(f"d={d}: exact {rows[-1][1]:.2f} s, matrix-free {rows[-1][2]:.2f} s "
              f"({mv} matvecs), ratio {rows[-1][1] / rows[-1][2]:.2f}", flush=True)
    lines = [f"# dense_threshold ({datetime.date.today()}, {platform.machine()}, torch "
             f"{torch.__version__}, 1 thread, median of {args.rounds})", "",
             "| d | exact s | matrix-free s | matrix-free matvecs | exact / matrix-free |",
             "|---|---|---|---|---|"]
    lines += [f"| {d} | {e:.2f} | {m:.2f} | {v} | {e / m:.2f} |" for d, e, m, v in rows]
    out = Path(__file__).parent / "results" / "dense_threshold.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
