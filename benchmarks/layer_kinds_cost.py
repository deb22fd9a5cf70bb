"""What the ``mixer`` / ``mlp`` columns cost (issue 54): ``with_layer_kinds`` on tables of a
32-layer stack's sizes, and ``analyze()`` with and without it, A/B interleaved in one process.

    .venv/bin/python benchmarks/layer_kinds_cost.py            # full: 7 A/B rounds
    .venv/bin/python benchmarks/layer_kinds_cost.py --quick    # 3 rounds, fewer repeats

A: ``analyze`` as shipped (kinds attached); B: the same with the attach step a pass-through.
Each A/B run records a fresh probe (nothing memoised between runs) on a tiny GPT-2 and reads
power, spectra, jacobian, propagation, topology, units and communities. Writes
benchmarks/results/layer_kinds_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import GPT2Config, GPT2Model

import spectral_hooks as sh
import spectral_hooks.analysis as analysis
from spectral_hooks.analysis.columns import SCHEMAS
from spectral_hooks.analysis.layer_kinds import with_layer_kinds

OUT = Path(__file__).resolve().parent / "results" / "layer_kinds_cost.json"
SECTIONS = ("power", "spectra", "jacobian", "propagation", "topology", "units", "communities")


def table_costs(repeats: int) -> dict[str, dict[str, float]]:
    """Median ms of with_layer_kinds on a power / jacobian / units table of a 32-layer stack."""
    anatomy = sh.anatomy_of(GPT2Model(GPT2Config(n_layer=32, n_embd=32, n_head=4)))
    shapes = {"power": (1, 35), "jacobian": (512, 40), "units": (4096, 20)}  # rows/layer, cols
    out = {}
    for name, (per_layer, n_cols) in shapes.items():
        rng = np.random.default_rng(0)
        table = pd.DataFrame(rng.standard_normal((32 * per_layer, n_cols)),
                             columns=[f"c{i}" for i in range(n_cols)])
        table.insert(0, "layer", np.repeat(np.arange(32), per_layer))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            with_layer_kinds(table, anatomy, SCHEMAS[name])  # type: ignore[arg-type]
            times.append(time.perf_counter() - start)
        out[name] = {"rows": len(table), "median_ms": 1e3 * statistics.median(times)}
    return out


def one_analysis(model: torch.nn.Module, ids: torch.Tensor) -> float:
    start = time.perf_counter()
    with sh.instrument(model) as probe, torch.no_grad():
        model(ids)
    report = probe.analyze(jacobian={"k": 4}, bottleneck=True, topology=True, progress=False)
    for name in SECTIONS:
        report[name]
    return time.perf_counter() - start


def ab_rounds(rounds: int, runs: int) -> dict[str, object]:
    model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    ids = torch.arange(32).reshape(2, 16)
    shipped = analysis.with_layer_kinds
    one_analysis(model, ids)  # warm up
    ratios, walls = [], {"A": [], "B": []}
    for r in range(rounds):
        seconds = {}
        for arm in ("A", "B") if r % 2 == 0 else ("B", "A"):
            analysis.with_layer_kinds = shipped if arm == "A" else (lambda t, a, s: t)
            seconds[arm] = statistics.median(one_analysis(model, ids) for _ in range(runs))
        analysis.with_layer_kinds = shipped
        ratios.append(seconds["A"] / seconds["B"])
        for arm in seconds:
            walls[arm].append(seconds[arm])
        print(f"  round {r}: with kinds {seconds['A']:.3f} s, without {seconds['B']:.3f} s, "
              f"ratio {ratios[-1]:.3f}, load {os.getloadavg()[0]:.1f}", flush=True)
    return {"ratio_median": statistics.median(ratios), "ratios": ratios, "seconds": walls}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, runs, repeats = (3, 3, 20) if args.quick else (7, 5, 100)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "load_1min": os.getloadavg()[0], "torch_threads": torch.get_num_threads(),
              "tables": table_costs(repeats)}
    for name, row in result["tables"].items():
        print(f"with_layer_kinds, {name} table of {row['rows']} rows: {row['median_ms']:.2f} ms")
    result["analyze_ab"] = ab_rounds(rounds, runs)
    print(f"analyze() with / without the kinds: median ratio "
          f"{result['analyze_ab']['ratio_median']:.3f}")
    OUT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
