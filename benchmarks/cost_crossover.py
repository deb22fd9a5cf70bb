"""Benchmark (issue 37): where on the CPU an operator application stops costing dispatch and
starts costing FLOPs: the crossover width of ``linalg.cost.CPU_FLOP_BOUND_N``.

The model family of ``benchmarks/host_bound.py`` (Llama-shaped, random init, seeded; head
dim min(128, d / 4), GQA 4:1 where the heads allow, MLP 3.5 d, 64 tokens, 4 layers, one torch
thread) at each width d of ``--widths``. The section timed is the matrix-free jacobian section
(``jacobian={"k": 16, "dense": False}``) in four arms, interleaved within each round, the
analysis cache cleared before each run (every arm's JVP graphs traced once before timing):

* ``groups+blocks``: layer groups and ``svds``' block default (the dispatch-bound shape; the
  rule forced off: ``cost.CPU_FLOP_BOUND_N`` set above every width);
* ``alone+single``: one layer at a time and single-vector ``svds`` (the FLOP-bound shape; the
  rule forced on: ``CPU_FLOP_BOUND_N = 0``);
* ``alone+blocks`` and ``groups+single``: one part of the rule each.

``eigs`` is the same in every arm (one column a step on the CPU). Per arm and width it prints
the median seconds a layer, forward-equivalents (seconds / one plain forward, medians of the
same round), operator applications (``n_matvecs`` a layer) and the ratio to ``groups+blocks``.

    OMP_NUM_THREADS=1 python benchmarks/cost_crossover.py [--widths 128 256 ...] [--rounds 2]
        [--arms groups+blocks alone+single] [--dense] [--out FILE.jsonl]

``--dense``: the exact section instead (``dense=True``: every layer's J in 64-column products,
in layer groups or one layer at a time; svds is not used there, so the arms differ in grouping
only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import torch  # noqa: E402
from jsonl import append_jsonl  # noqa: E402

#: arm -> (group_layers, CPU_FLOP_BOUND_N while it runs)
ARMS = {"groups+blocks": (True, 10 ** 9), "alone+single": (False, 0),
        "alone+blocks": (False, 10 ** 9), "groups+single": (True, 0)}
LAYERS, TOKENS, K = 4, 64, 16


def shape(d: int) -> tuple:
    """(heads, kv heads, MLP width) of the host_bound family at width d."""
    head_dim = min(128, d // 4)
    heads = d // head_dim
    kv = heads // 4 if heads % 4 == 0 else 1
    return heads, max(kv, 1), int(3.5 * d)


def build(d: int):
    """(model, probe, ids): the host_bound family at width d, instrumented, one forward."""
    from launch_budget import build as build_llama

    model, probe = build_llama(d, TOKENS, LAYERS, shape=shape(d))
    return model, probe, torch.randint(0, 1000, (1, TOKENS),
                                       generator=torch.Generator().manual_seed(1))


def run_arm(probe, arm: str, dense: bool = False) -> tuple:
    """(seconds, table) of one section run in ``arm``, from an empty analysis cache."""
    from spectral_hooks.linalg import cost

    group, bound = ARMS[arm]
    saved = cost.CPU_FLOP_BOUND_N
    cost.CPU_FLOP_BOUND_N = bound
    try:
        probe.invalidate()
        t = time.perf_counter()
        table = probe.analyze(power=False, progress=False, jacobian={
            "k": K, "dense": dense, "group_layers": group}).jacobian
        return time.perf_counter() - t, table
    finally:
        cost.CPU_FLOP_BOUND_N = saved


def forward_seconds(model, ids, n: int = 10) -> float:
    times = []
    with torch.no_grad():
        for _ in range(n):
            t = time.perf_counter()
            model(input_ids=ids)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(d: int, arms: list[str], rounds: int, dense: bool = False) -> list[dict]:
    model, probe, ids = build(d)
    tables = {arm: run_arm(probe, arm, dense)[1] for arm in arms}  # traces every arm's graphs
    secs: dict[str, list[float]] = {arm: [] for arm in arms}
    fwd = []
    for r in range(rounds):
        fwd.append(forward_seconds(model, ids))
        order = arms if r % 2 == 0 else arms[::-1]
        for arm in order:
            secs[arm].append(run_arm(probe, arm, dense)[0])
    fwd.append(forward_seconds(model, ids))
    forward = statistics.median(fwd)
    ref = tables[arms[0]]
    rows = []
    for arm in arms:
        t = tables[arm]
        gap = float(((t["top_eig_abs"] - ref["top_eig_abs"]).abs() / ref["top_eig_abs"]).max())
        s = statistics.median(secs[arm]) / LAYERS
        rows.append(dict(d=d, arm=arm, dense=dense, seconds=s, seconds_all=[x / LAYERS for x in secs[arm]],
                         forward_s=forward, forward_equivalents=s / forward,
                         n_matvecs=float(t["n_matvecs"].sum()) / LAYERS,
                         converged=bool(t["converged"].all()), top_eig_rel_gap=gap,
                         vs_first=s / (statistics.median(secs[arms[0]]) / LAYERS),
                         layers=LAYERS, tokens=TOKENS, rounds=rounds,
                         load_avg_1min=round(os.getloadavg()[0], 2),
                         date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    probe.remove()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[128, 256, 384, 512, 768, 1024])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dense", action="store_true",
                    help="the exact section (dense J, then LAPACK) instead of the matrix-free one")
    ap.add_argument("--out", default=None, help="append the JSON lines to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for d in args.widths:
        for row in measure(d, args.arms, args.rounds, args.dense):
            print(json.dumps(row), flush=True)
            append_jsonl(args.out, [row])


if __name__ == "__main__":
    main()
