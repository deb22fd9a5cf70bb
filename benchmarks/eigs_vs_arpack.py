"""Benchmark: spectral_hooks.linalg.eigs vs scipy ARPACK eigs on clustered 768 x 768 matrices.

(a) one dense matrix I + small random (top spectrum clustered near the edge of a disk around 1,
like a transformer block Jacobian), (b) a batch of 12 such matrices. k = 16. Timing is
interleaved (ours, ARPACK default ncv, ARPACK large ncv, repeated) per BENCHMARKING.md; the
dense oracle is computed after all timed sections. Prints a markdown table and writes it to
benchmarks/results/eigs_vs_arpack.md.

    python benchmarks/eigs_vs_arpack.py [--rounds 3] [--batch 12] [--quick]
    python benchmarks/eigs_vs_arpack.py --llama [--rounds 5]
    python benchmarks/eigs_vs_arpack.py --batched [--rounds 3]

``--batched`` (issue 37): the batch of six solved together, as a [6, n, n] tensor, as a list of
``DenseOperator`` s and in the accelerator's shape (``device_path=True``), against ARPACK one by
one; writes benchmarks/results/eigs_vs_arpack_batched.md.

``--quick`` (what produced the committed results file): 2 timed rounds, a batch of 6.
``--llama`` (issue 24): the operator eigs exists for, a Llama-shaped block Jacobian (d=1024,
GQA 8/2, ffn 3584, 128 tokens, one layer at random init, last token, float64 operator from
``probe.jacobian(0)``), k=16, tol=1e-8: ``eigs`` at its defaults (on the CPU one column per
step, matrix-free) and with ``materialize="auto"`` (it materialises this operator) vs scipy
ARPACK ncv=64 with single-column matvecs through the same operator, interleaved; dense oracle
afterwards.
Writes benchmarks/results/eigs_vs_arpack_llama.md.
One thread everywhere (torch and numpy's BLAS), set before numpy is imported.
"""

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import scipy.sparse.linalg as sla
import torch

from spectral_hooks.linalg import DenseOperator, eigs

N, K, BATCH, NCV_BIG = 768, 16, 12, 128


def make(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.eye(N, dtype=torch.float64) + 0.15 * torch.randn(
        N, N, generator=g, dtype=torch.float64) / N ** 0.5


def arpack(mats, ncv):
    vals, counts = [], []
    for M in mats:
        Mn, c = M.numpy(), [0]

        def mv(x, Mn=Mn, c=c):
            c[0] += 1
            return Mn @ x
        op = sla.LinearOperator((N, N), matvec=mv, dtype=np.float64)
        try:
            w = sla.eigs(op, k=K, ncv=ncv, tol=1e-10, v0=np.ones(N))[0]
        except sla.ArpackNoConvergence as e:
            w = e.eigenvalues
        vals.append(torch.tensor(w))
        counts.append(c[0])
    return vals, counts


def err(vals, ref):
    """Two-sided max relative distance, conjugation-invariant (|lambda_16| = |lambda_17| can
    be a conjugate pair: either member is a right answer)."""
    a = vals.flatten()
    a = a[~torch.isnan(a)]
    b = ref[: a.numel()]
    d = torch.minimum((a[:, None] - b[None, :]).abs(), (a[:, None] - b[None, :].conj()).abs())
    return max((d.min(1).values / a.abs()).max().item(), (d.min(0).values / b.abs()).max().item())


def llama(rounds):
    """eigs defaults vs ARPACK ncv=64 on a Llama-shaped d=1024 block Jacobian (issue 24)."""
    from transformers import LlamaConfig, LlamaModel

    import spectral_hooks as sh

    cfg = LlamaConfig(hidden_size=1024, intermediate_size=3584, num_hidden_layers=1,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                      vocab_size=1000, max_position_embeddings=8192, rope_theta=500000.0,
                      rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaModel(cfg).eval()
    ids = torch.randint(0, 1000, (1, 128), generator=torch.Generator().manual_seed(1))
    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=ids)
    J = probe.jacobian(0)
    n, k, tol = J.shape[0], 16, 1e-8

    def arp():
        c = [0]

        def mv(x):
            c[0] += 1
            return J.matvec(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))).numpy()
        op = sla.LinearOperator((n, n), matvec=mv, dtype=np.float64)
        w = sla.eigs(op, k=k, ncv=64, tol=tol, return_eigenvectors=False)
        return torch.tensor(w), c[0]
    OURS, AUTO, ARP = "ours eigs (defaults)", 'ours eigs(materialize="auto")', "ARPACK ncv=64"
    runs = {OURS: lambda: eigs(J, k, tol=tol),
            AUTO: lambda: eigs(J, k, tol=tol, materialize="auto"), ARP: arp}
    times = {r: [] for r in runs}
    outs = {r: [] for r in runs}
    for rnd in range(rounds + 1):  # round 0 = warm-up (builds the JVP graphs)
        for r, f in runs.items():
            t = time.perf_counter()
            o = f()
            if rnd:
                times[r].append(time.perf_counter() - t)
                outs[r].append(o)
    ref = torch.linalg.eigvals(J.to_dense())  # oracle after the timed sections
    ref = ref[torch.argsort(-ref.abs())]
    mv_arp = [o[1] for o in outs[ARP]]
    lines = [
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}; Llama-shaped "
        "block Jacobian (d=1024, GQA 8/2, ffn 3584, 128 tokens, random init, last token, "
        f"float64 operator), k={k}, tol={tol:g}; {rounds} interleaved rounds after a warm-up; "
        "error = max relative distance to torch.linalg.eigvals of J.to_dense() (after the "
        "timed sections). The defaults iterate on this operator, one column per step "
        "(matrix-free); `materialize=\"auto\"` materialises it on the CPU (1024 columns in "
        "eight 128-column products, the iteration on the matrix, every pair checked with "
        "fresh products: linalg/materialize.py).", "",
        "| solver | median s | operator applications (per round) | max rel. error | "
        "converged |", "|---|---|---|---|---|"]
    for r in (OURS, AUTO):
        conv = all(bool(o.converged) for o in outs[r])
        lines.append(f"| {r} | {statistics.median(times[r]):.2f} | "
                     f"{[o.n_matvecs for o in outs[r]]} | "
                     f"{max(err(o.values, ref) for o in outs[r]):.1e} | {conv} |")
    lines += [f"| {ARP} | {statistics.median(times[ARP]):.2f} | {mv_arp} | "
              f"{max(err(o[0], ref) for o in outs[ARP]):.1e} | n/a (reports success) |", ""]
    for r in (OURS, AUTO):
        ratio = [a / b for a, b in zip(times[r], times[ARP])]
        mv_ratio = [o.n_matvecs / b for o, b in zip(outs[r], mv_arp)]
        lines.append(f"{r} / ARPACK wall, per round: median {statistics.median(ratio):.2f} "
                     f"({min(ratio):.2f}-{max(ratio):.2f}); applications: median "
                     f"{statistics.median(mv_ratio):.2f} ({min(mv_ratio):.2f}-"
                     f"{max(mv_ratio):.2f}).")
    text = "\n".join(lines) + "\n"
    print(text)
    (Path(__file__).parent / "results" / "eigs_vs_arpack_llama.md").write_text(text)
    probe.remove()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--quick", action="store_true", help="2 rounds, a batch of 6")
    ap.add_argument("--llama", action="store_true", help="the Llama d=1024 block Jacobian")
    ap.add_argument("--batched", action="store_true",
                    help="issue 37: six matrices solved together (a [6, n, n] tensor and a list "
                    "of DenseOperators) vs ARPACK one by one")
    args = ap.parse_args()
    if args.llama:
        torch.set_num_threads(1)
        return llama(args.rounds)
    if args.quick or args.batched:
        args.rounds, args.batch = (2 if args.quick else args.rounds), 6
    torch.set_num_threads(1)
    mats = [make(s) for s in range(args.batch)]
    cases = {"(a) single": mats[:1], f"(b) batch of {args.batch}": mats}
    if args.batched:
        cases = {f"batch of {args.batch}, solved together": mats}
    rows = []
    for name, ms in cases.items():
        stack = torch.stack(ms)
        runs = {
            "ours eigs": lambda: eigs(stack if len(ms) > 1 else ms[0], K),
            "ARPACK ncv=default": lambda: arpack(ms, None),
            f"ARPACK ncv={NCV_BIG}": lambda: arpack(ms, NCV_BIG),
        }
        if args.batched:
            ops = [DenseOperator(M) for M in ms]
            runs["ours eigs, list of DenseOperators"] = lambda: eigs(ops, K)
            runs["ours eigs, device_path=True"] = lambda: eigs(stack, K, device_path=True)
        times = {r: [] for r in runs}
        out = {}
        for rnd in range(args.rounds + 1):  # round 0 = warm-up
            for r, f in runs.items():
                t = time.perf_counter()
                out[r] = f()
                if rnd:
                    times[r].append(time.perf_counter() - t)
        refs = [torch.linalg.eigvals(M) for M in ms]  # oracle after the timed sections
        refs = [e[torch.argsort(-e.abs())] for e in refs]
        for r in runs:
            if r.startswith("ours"):
                res = out[r]
                vals = res.values.reshape(len(ms), -1)
                e = max(err(vals[i], refs[i]) for i in range(len(ms)))
                mv, conv = res.n_matvecs, bool(res.converged.all())
            else:
                vals, counts = out[r]
                e = max(err(vals[i], refs[i]) for i in range(len(ms)))
                mv, conv = max(counts), "n/a (reports success)"
            ratio = [a / b for a, b in zip(times[r], times["ours eigs"])]
            rows.append((name, r, statistics.median(times[r]), statistics.median(ratio),
                         min(ratio), max(ratio), mv, e, conv))
        ours_mv = rows[-len(runs)][6]
        rows[-len(runs):] = [(*row[:6], f"{row[6]} ({row[6] / ours_mv:.2f}x ours)", *row[7:])
                             for row in rows[-len(runs):]]
    lines = [f"torch threads: {torch.get_num_threads()}, BLAS threads: "
             f"{os.environ.get('OPENBLAS_NUM_THREADS')}, n={N}, k={K}, rounds={args.rounds} "
             "timed after 1 warm-up, interleaved; matvecs = max per operator (ours: probe "
             "and final check included); error vs torch.linalg.eigvals after the timed "
             "sections", "",
             "| case | solver | median s | time / ours (med [min, max]) | matvecs | "
             "max rel. error vs dense eig | converged |", "|---|---|---|---|---|---|---|"]
    for (c, r, t, med, lo, hi, mv, e, conv) in rows:
        lines.append(f"| {c} | {r} | {t:.3f} | {med:.2f} [{lo:.2f}, {hi:.2f}] | {mv} | "
                     f"{e:.1e} | {conv} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out_path = Path(__file__).parent / "results" / (
        "eigs_vs_arpack_batched.md" if args.batched else "eigs_vs_arpack.md")
    out_path.parent.mkdir(exist_ok=True)
    out_path.write_text(text)


if __name__ == "__main__":
    main()
