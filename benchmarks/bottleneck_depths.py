"""Benchmark: what ``jacobian={"bottleneck_depths": "log2"}`` saves in the matrix-free
``bottleneck`` section, counted on the host-bound proxy of ``bottleneck_budget.py`` (Llama, GQA
4/1, d = 256, 64 tokens, one thread) at one depth L: sequential block applications
(``host_bound.Applications``) and seconds, every depth vs log2 depths, with the symmetric
ablation (its single-layer rows run at full depth either way) and without it. Counts are exact
(deterministic); seconds are one run each, after a warm-up run that traces the graphs.

    python benchmarks/bottleneck_depths.py [--d 256] [--layers 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_bound  # noqa: E402


def section(probe, depths, ablations):
    from spectral_hooks.analysis import AnalyzeOptions
    from spectral_hooks.analysis.bottleneck import bottleneck_section

    options = AnalyzeOptions(power=False, bottleneck=True, progress=False,
                             jacobian={"k": 16, "dense": False, "bottleneck_dense": False,
                                       "ablations": ablations, "bottleneck_depths": depths})
    return bottleneck_section(probe.subject, options)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    opt = ap.parse_args()
    name = f"d{opt.d}x{opt.layers}"
    host_bound.PROXIES[name] = (opt.d, 4, 1, 7 * opt.d // 2, opt.layers, 64)
    _, probe, _ = host_bound.build(name, "cpu")
    print("| ablations | depths | rows | sequential block applications | seconds |")
    print("|---|---|---|---|---|")
    for ablations in (("symmetric",), ()):
        for depths in (None, "log2"):
            section(probe, depths, ablations)  # warm-up: traces
            apps = host_bound.Applications()
            try:
                start = time.perf_counter()
                table = section(probe, depths, ablations)
                seconds = time.perf_counter() - start
            finally:
                apps.restore()
            print(f"| {ablations or '()'} | {depths or 'every'} | {len(table)} | {apps.calls:,} | "
                  f"{seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
