"""Cost of one analysis-cache lookup on a GPT-2-small-sized model (124M parameters).

    python benchmarks/cache_lookup.py            # ~1 min; writes results/cache_lookup.md

Before (the analyzer of sessions 1-2): the key was every parameter's float64 sum and norm
(a full pass over the weights, several reads of each element). After: ``AnalysisCache.refresh``
compares each tensor's identity, storage, dtype, device and ``_version`` plus the bit pattern
of a fixed strided sample of 64 elements per tensor. Both are timed interleaved (A B A B ...),
one torch thread, median and range over rounds; float32 model, random init (no download).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import GPT2Config, GPT2Model

from spectral_hooks.analysis.cache import AnalysisCache
from spectral_hooks.recording.core import Recording


def old_key(model: torch.nn.Module) -> tuple:
    """The previous cache key, as the old analyzer computed it on every lookup."""
    with torch.no_grad():
        return tuple((p.data_ptr(), p._version, float(p.sum(dtype=torch.float64)),
                      float(torch.linalg.vector_norm(p, dtype=torch.float64)))
                     for p in model.parameters())


def timed(fn, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                              "cache_lookup.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT2Model(GPT2Config()).eval()  # 124M parameters, float32
    n_params = sum(p.numel() for p in model.parameters())
    recording = Recording(n_layers=12, layers=tuple(range(12)), capture=("resid_post",))
    cache = AnalysisCache(model, recording)
    cache.refresh()
    old_key(model)
    old, new = [], []
    for _ in range(args.rounds):
        old.append(timed(lambda: old_key(model), 3))
        new.append(timed(cache.refresh, 200))
    ratios = [o / n for o, n in zip(old, new)]
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.3f} ms ({min(xs) * 1e3:.3f}-{max(xs) * 1e3:.3f})"  # noqa: E731
    text = f"""# Analysis-cache lookup cost

Script `benchmarks/cache_lookup.py` · {datetime.date.today()} · {platform.machine()} CPU,
torch threads 1 · torch {torch.__version__}, transformers {transformers.__version__} ·
GPT-2-small config at random init ({n_params / 1e6:.1f}M parameters, float32, {len(list(model.parameters()))}
parameter tensors + {len(list(model.buffers()))} buffers) · {args.rounds} interleaved rounds, median (min-max).

| cache key | one lookup |
|---|---|
| before: float64 sum + norm of every parameter | {ms(old)} |
| after: tensor metadata + strided 64-element sample per tensor | {ms(new)} |

Speed-up: **{statistics.median(ratios):.0f}x** (min {min(ratios):.0f}x, max {max(ratios):.0f}x).
Goal: under 1 ms per lookup — **{"met" if statistics.median(new) < 1e-3 else "missed"}**.
"""
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
