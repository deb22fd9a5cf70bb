"""Benchmark (issue 37, item 5): what the matrix-free ``bottleneck`` section costs in GPU terms,
counted on the CPU proxy at several depths, and its projection to the Llama-3-8B shape.

The section at the 8B shape (d = 4096 > ``SCHUR_MAX_D``) runs matrix-free: for every depth l the
top-k singular values of P_l = J_l ... J_1 (``svds``) and the SLQ rank estimates of P_l, the
same for the symmetric ablation, the symmetric ablation of one layer at a time at full depth,
and the propagation table. Every application of P_l is l block applications in sequence;
the depths (and the ablated layers) run in lockstep, one sweep through the chain serving all
of them (``linalg.chains``), so the sequential applications grow linearly with the depth and
the columns an application carries with the number of chains (before 2026-12-07 the depths
ran one after another: quadratic). This script runs
exactly that path on a host-bound proxy shaped as ``host_bound.py``'s (Llama, GQA 4/1, MLP
3.5 d, 64 tokens, one thread; ``jacobian={"bottleneck_dense": False, "ablations":
("symmetric",)}``, the path d > 1024 takes by default) at a few depths, and counts per run:

* ``applications``: sequential block applications (``host_bound.Applications``);
* ``solver_ops``: top-level aten ops outside the operator's graph, ``total_ops`` with the
  operator's own; ``syncs``: host syncs, as ``host_bound.py`` counts them;
* ``seconds``: wall time of the section without the profiler.

The width is d = 256 by default, not the jacobian proxy's 128: ``svds`` of k = 32 (the
section's default ``bottleneck_k``) takes its block method only where a block Krylov space of
4k columns fits (``linalg.svd._shape``), as at d = 4096; at d = 128 it falls back to one
column a step and would overstate the applications several times.

It fits applications, solver ops and syncs as a L + b L^2 in the depth L (least squares over
the depths run) and projects the section at L = 32 with the launch model of
``launch_budget.py``: every top-level op is a launch of ``LAUNCH`` = 86 us of host time
(measured on an H200), a sync ``SYNC`` = 15 us, plus one read of a block's float64 weights
(1.75 GB at d = 4096) from HBM per application. A projection, not a measurement.

    python benchmarks/bottleneck_budget.py [--d 256] [--depths 2 3 4] [--out FILE]
    python benchmarks/bottleneck_budget.py --project FILE   # the projection of measured rows
    python benchmarks/bottleneck_budget.py --device cuda --depths 2 3   # (gpu_session.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_bound  # noqa: E402
from jsonl import append_jsonl  # noqa: E402
from launch_budget import HBM, LAUNCH, SYNC  # noqa: E402

from spectral_hooks.linearize.engine import DENSE_WIDTH  # noqa: E402

K = 16
#: the Llama-3-8B shape's depth and one block's float64 weights (218 M parameters)
DEPTH_8B, BLOCK_BYTES_8B = 32, 218e6 * 8
#: columns of one pass of a block's widest traced JVP graph
PASS = DENSE_WIDTH


def section(probe):
    """The ``bottleneck`` and ``propagation`` tables on the path a d > 1024 model takes."""
    from spectral_hooks.analysis import AnalyzeOptions
    from spectral_hooks.analysis.bottleneck import bottleneck_section, propagation_section

    options = AnalyzeOptions(power=False, bottleneck=True, progress=False,
                             jacobian={"k": K, "dense": False, "bottleneck_dense": False,
                                       "ablations": ("symmetric",)})
    return (bottleneck_section(probe.subject, options),
            propagation_section(probe.subject, options))


def run(d: int, depth: int, device: str = "cpu") -> dict:
    heads, kv, ffn, tokens = 4, 1, 7 * d // 2, 64
    name = f"d{d}x{depth}"
    host_bound.PROXIES[name] = (d, heads, kv, ffn, depth, tokens)
    _, probe, _ = host_bound.build(name, device)
    section(probe)  # traces the JVP graphs: not what is counted
    host_bound.sync(device)
    start = time.perf_counter()
    table, _ = section(probe)
    host_bound.sync(device)
    seconds = time.perf_counter() - start
    apps = host_bound.Applications()
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof, host_bound.Reads() as reads:
            section(probe)
        counts = host_bound.counts(prof.events(), reads.n)
    finally:
        apps.restore()
    probe.remove()
    return dict(what="bottleneck + propagation sections, matrix-free, symmetric ablation",
                proxy=name, d=d, layers=depth, tokens=tokens, device=device,
                applications=apps.calls,
                seconds=seconds, block_matvecs=int(table["n_matvecs"].max()), **counts,
                torch=torch.__version__, threads=torch.get_num_threads(),
                load_avg_1min=round(os.getloadavg()[0], 2),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))


def fit(rows: list[dict], key: str) -> tuple[float, float]:
    """(a, b) >= 0 of key ~ a L + b L^2, least squares over the rows' depths (a count cannot
    shrink with depth: where the free fit gives a negative term, the best one-term fit)."""
    L = torch.tensor([float(r["layers"]) for r in rows], dtype=torch.float64)
    y = torch.tensor([float(r[key]) for r in rows], dtype=torch.float64)[:, None]
    A = torch.stack([L, L * L], dim=1)
    best, best_err = (0.0, 0.0), float("inf")
    for cols in ([0, 1], [0], [1]):
        sol = torch.linalg.lstsq(A[:, cols], y).solution[:, 0]
        if bool((sol < 0).any()):
            continue
        coef = [0.0, 0.0]
        for c, v in zip(cols, sol.tolist()):
            coef[c] = v
        err = float((A @ torch.tensor(coef, dtype=torch.float64)[:, None] - y).norm())
        if err < best_err - 1e-9 * float(y.norm()):
            best, best_err = (coef[0], coef[1]), err
    return best


def projection(rows: list[dict]) -> dict:
    """The section at the 8B shape from the fitted counts and the launch model.

    Since the depths run in lockstep (``linalg.chains``), an application carries the columns
    of every depth through that block: at L = 32 up to 16 probes x 64 chains, where the proxy's
    L <= 4 never passes one 128-column graph pass. So the operator's launches are projected
    per pass: passes <= applications + block_matvecs / PASS (each application rounds its
    columns up to whole passes), each costing the proxy's operator ops per application (one
    pass there), plus the solvers' own ops; weights are read once a pass."""
    at = {}
    for key in ("applications", "solver_ops", "total_ops", "syncs", "block_matvecs"):
        a, b = fit(rows, key)
        at[key] = a * DEPTH_8B + b * DEPTH_8B ** 2
        at[f"{key}_fit"] = [a, b]
    per_pass = sum((r["total_ops"] - r["solver_ops"]) / r["applications"] for r in rows) / len(rows)
    passes = at["applications"] + at["block_matvecs"] / PASS
    launches = passes * per_pass + at["solver_ops"]
    weights = passes * BLOCK_BYTES_8B / HBM
    seconds = launches * LAUNCH + at["syncs"] * SYNC + weights
    # each pass one CUDA-graph replay (linearize.cuda_graphs) instead of its ops
    replayed = (passes + at["solver_ops"]) * LAUNCH + at["syncs"] * SYNC + weights
    return dict(what="projected at Llama-3-8B (L = 32), H200 launch model", **at,
                passes=passes, ops_per_pass=per_pass, launches=launches,
                launch_s=launches * LAUNCH, sync_s=at["syncs"] * SYNC, weights_s=weights,
                seconds=seconds, seconds_replayed=replayed)


def report(proj: dict) -> str:
    a, b = proj["applications_fit"]
    return (f"per depth L: applications ~ {a:.1f} L + {b:.1f} L^2; at L = {DEPTH_8B}: "
            f"{proj['applications']:,.0f} applications, <= {proj['passes']:,.0f} graph passes "
            f"({proj['block_matvecs']:,.0f} block columns), {proj['launches']:,.0f} launches, "
            f"{proj['syncs']:,.0f} syncs -> {proj['seconds']:,.0f} s projected (launches "
            f"{proj['launch_s']:,.0f} s, syncs {proj['sync_s']:,.0f} s, weights "
            f"{proj['weights_s']:,.0f} s); with every pass one CUDA-graph replay "
            f"{proj['seconds_replayed']:,.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=256, help="the proxy's width")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (seconds then a GPU's)")
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--out", default=None, help="append the JSON lines to this file")
    ap.add_argument("--project", default=None,
                    help="only project from the measured rows of this JSONL file")
    args = ap.parse_args()
    if args.project:
        rows = [r for r in map(json.loads, open(args.project)) if "layers" in r]
        print(report(projection(rows)))
        return
    torch.set_num_threads(1)
    rows = []
    for depth in args.depths:
        row = run(args.d, depth, args.device)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if len({r["layers"] for r in rows}) >= 2:  # a L + b L^2 needs two depths
        proj = projection(rows)
        print(json.dumps(proj), flush=True)
        print("\n" + report(proj))
        rows = rows + [proj]
    else:
        print("one depth: no projection (a L + b L^2 needs two)")
    append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
