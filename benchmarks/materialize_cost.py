"""When should ``eigs(materialize="auto")`` materialise a batched operator? Measures the rule's
constant and both paths (eigs' default is matrix-free: ``materialize=False``).

    python benchmarks/materialize_cost.py            # ~2 min, one thread
    python benchmarks/materialize_cost.py --quick    # GPT-2 only, k = 16

Operators: the last-token block Jacobian (float64 operator, single-query, batched JVPs) of a
GPT-2-small-sized block (d=768) and a Llama-shaped one (d=1024, GQA 8/2, ffn 3584), 128 tokens,
random init, CPU, one torch/BLAS thread. Measured, per operator:

* the cost of a column inside a block of W = 16 / 32 / 64 / 128 columns, relative to one column
  alone (``materialize.COLUMN_COST`` is the rule's assumption at W = 128);
* ``eigs(J, k, tol=1e-8)`` with ``materialize=True`` and ``materialize=False``, interleaved
  (``--rounds``, median), for k = 4, 8, 16: wall, operator applications, error against the dense
  eig of the materialised operator (computed after the timed sections), and which path
  ``materialize="auto"`` takes (``materialize.pays``), so the rule's choice can be read against
  the faster path.
Writes benchmarks/results/materialize_cost.md.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_v] = "1"  # before numpy/torch load their BLAS

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "materialize_cost.md"


def build(kind: str):
    import spectral_hooks as sh
    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaModel
        cfg = LlamaConfig(hidden_size=1024, intermediate_size=3584, num_hidden_layers=1,
                          num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                          vocab_size=1000, max_position_embeddings=8192,
                          rope_theta=500000.0, rms_norm_eps=1e-5, bos_token_id=0,
                          eos_token_id=0, pad_token_id=0)
        model, vocab = LlamaModel(cfg).eval(), 1000
    else:
        from transformers import GPT2Config, GPT2Model
        model, vocab = GPT2Model(GPT2Config(n_layer=1, n_embd=768, n_head=12)).eval(), 50257
    ids = torch.randint(0, vocab, (1, 128), generator=torch.Generator().manual_seed(1))
    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=ids)
    return probe.jacobian(0)


def best_of(f, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def top_err(values: torch.Tensor, dense: torch.Tensor) -> float:
    v = values.flatten()
    v = v[torch.isfinite(v.real)]
    want = dense[torch.argsort(-dense.abs(), stable=True)][:v.shape[0]]
    cand = torch.cat([v, v.conj()])
    return float(max((cand - w).abs().min() for w in want) / dense.abs().max())


def measure(kind: str, ks, rounds: int) -> list[str]:
    from spectral_hooks.linalg import eigs, materialize
    from spectral_hooks.linalg.batch import OpBatch
    from spectral_hooks.linalg.eigs_parts import block_size_for, validate

    J = build(kind)
    n = J.shape[0]
    x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    J.matvec(x)
    one = best_of(lambda: J.matvec(x), 7)
    lines = [f"### {kind} (d = {n})", "",
             f"One column alone: {one * 1e3:.2f} ms (best of 7).", "",
             "| W | one W-column product, ms | per column / one column alone |", "|---|---|---|"]
    for W in (16, 32, 64, 128):
        X = torch.randn(n, W, dtype=torch.float64, generator=torch.Generator().manual_seed(W))
        J.matmat(X)  # a first product at a width traces its graph
        tw = best_of(lambda: J.matmat(X), 3)
        lines.append(f"| {W} | {tw * 1e3:.1f} | {tw / (W * one):.3f} |")
    lines += ["", "| k | ncv | \"auto\" path | materialised: s / applications / error | "
              "iterated: s / applications / error | faster |", "|---|---|---|---|---|---|"]
    dense = torch.linalg.eigvals(J.to_dense())
    for k in ks:
        batch = OpBatch(J, what="eigs")
        m, _ = validate(batch, k, "LM", 1e-8, None, 1000, block_size_for(batch, None))
        path = "materialise" if materialize.pays(batch, m=m) else "iterate"
        wall: dict[bool, list] = {True: [], False: []}
        res = {}
        for _ in range(rounds):
            for forced in (True, False):
                t = time.perf_counter()
                res[forced] = eigs(J, k, tol=1e-8, materialize=forced)
                wall[forced].append(time.perf_counter() - t)
        cells = []
        for forced in (True, False):
            r = res[forced]
            assert bool(r.converged), (kind, k, forced)
            cells.append(f"{statistics.median(wall[forced]):.2f} / {r.n_matvecs} / "
                         f"{top_err(r.values, dense):.0e}")
        fast = "materialised" if statistics.median(wall[True]) < statistics.median(
            wall[False]) else "iterated"
        lines.append(f"| {k} | {m} | {path} | {cells[0]} | {cells[1]} | {fast} |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    opt = ap.parse_args()
    torch.set_num_threads(1)
    kinds, ks = (["gpt2"], [16]) if opt.quick else (["gpt2", "llama"], [4, 8, 16])
    lines = ["# Materialise or iterate: the cost of a column in a block, and both eigs paths", "",
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}, "
             f"one thread, load average {os.getloadavg()[0]:.1f}. Command: `python "
             f"benchmarks/materialize_cost.py{' --quick' if opt.quick else ''}`. eigs tol=1e-8; "
             f"median of {opt.rounds} interleaved rounds; error: max distance of the dense "
             "top-k to the returned values, relative to |lambda_1|.", ""]
    for kind in kinds:
        lines += measure(kind, ks, opt.rounds)
    text = "\n".join(lines)
    print(text)
    opt.out.parent.mkdir(parents=True, exist_ok=True)
    opt.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
