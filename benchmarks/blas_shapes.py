"""Benchmark: torch's CPU BLAS against numpy's on the products the solvers make, one thread.

The CPU comparisons with scipy's ARPACK (``eigs_vs_arpack.py``) pit torch's BLAS, which makes
our matvecs, against numpy's, which makes ARPACK's. The torch 2.13 CPU wheel links Intel MKL and
numpy links OpenBLAS; on an AMD CPU, MKL's float64 kernels for a thin operand can run several
times slower than OpenBLAS's, and some memory layouts far slower still. This script measures
that on the machine it runs on, for the shapes that matter: a dense n x n matrix times 1, 8, 16,
32 and 128 columns (dense operators, ``to_dense``, block Krylov), in each layout of the two
operands, and float32 next to float64.

    python benchmarks/blas_shapes.py [--n 768] [--out FILE]

Prints a markdown table (GFLOP/s, higher is better; median of 5 timings of a loop), plus the
CPU model and both BLAS libraries; ``--out`` also writes it to FILE.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

WIDTHS = (1, 8, 16, 32, 128)
#: name -> (the matrix in column-major order, the block in column-major order)
LAYOUTS = {"A @ X": (False, False), "A col-major @ X": (True, False),
           "A @ X col-major": (False, True), "both col-major": (True, True)}


def seconds(f, budget: float = 0.2) -> float:
    """Median of 5 timings of a loop of f that takes about ``budget`` / 5 seconds."""
    f()
    t = time.perf_counter()
    f()
    reps = max(1, int(budget / 5 / max(time.perf_counter() - t, 1e-7)))
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            f()
        times.append((time.perf_counter() - t) / reps)
    return statistics.median(times)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numpy_blas() -> str:
    try:
        from threadpoolctl import threadpool_info
        return ", ".join(f"{i['internal_api']} {i.get('version', '')}".strip()
                         for i in threadpool_info() if i.get("user_api") == "blas")
    except ImportError:
        return "see numpy.show_config()"


def table(n: int) -> str:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    mkl = "MKL" if torch.backends.mkl.is_available() else "not MKL"
    lines = [f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_model()}; torch "
             f"{torch.__version__} (BLAS: {mkl}), numpy {np.__version__} (BLAS: {numpy_blas()});"
             f" one thread; n = {n}; GFLOP/s of an n x n matrix times an n x c block, torch / "
             "numpy (higher is better).", "",
             "| dtype | layout | " + " | ".join(f"c = {c}" for c in WIDTHS) + " |",
             "|---|---|" + "---|" * len(WIDTHS)]
    for dtype in (torch.float64, torch.float32):
        for name, (a_cm, x_cm) in LAYOUTS.items():
            cells = []
            for c in WIDTHS:
                A = torch.randn(n, n, generator=g, dtype=dtype)
                X = torch.randn(n, c, generator=g, dtype=dtype)
                A = A.mT.contiguous().mT if a_cm else A
                X = X.mT.contiguous().mT if x_cm else X
                An, Xn = A.numpy(), X.numpy()
                flop = 2 * n * n * c
                ours = flop / seconds(lambda: A @ X) / 1e9
                theirs = flop / seconds(lambda: An @ Xn) / 1e9
                cells.append(f"{ours:.1f} / {theirs:.1f}")
            lines.append(f"| {str(dtype)[6:]} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    text = table(args.n)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
