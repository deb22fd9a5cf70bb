"""Top-16 eigenvalues of every layer's last-token block Jacobian: spectral_hooks vs what a user
would write. GPT-2-small-sized random-init config (12 layers, d=768, 12 heads), 128 tokens,
float32 model, torch.set_num_threads(2).

    python benchmarks/jacobian_spectra.py            # all 12 layers (~10 min on 2 loaded cores)
    python benchmarks/jacobian_spectra.py --quick    # layers 0 and 11, fewer rounds

Contenders
* ours: ``eigs(block_jacobian(..., dtype=float32), 16, tol=1e-5)`` per layer, end to end
  (operator build, single-query linearisation, Krylov-Schur, final residual check).
* user ARPACK: ``scipy.sparse.linalg.eigs(k=16)`` over a LinearOperator whose matvec is a
  full-sequence ``torch.func.jvp`` of the block (float32), at default ncv and at ncv=96 (large
  enough to be right). Its cost = (matvecs ARPACK needs) x (measured cost of that matvec); the
  matvec counts come from running ARPACK on our operator (the same linear map) - a full
  user-level ARPACK run costs minutes per layer here, so it is extrapolated and marked so.
* jacrev + eig: ``torch.func.jacrev`` of the block's last-token output w.r.t. its input row,
  then ``torch.linalg.eigvals``; timed on ``--jacrev-layers`` layers and extrapolated to all.
Accuracy: top-16 moduli vs float64 dense eig (computed after every timed section).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).parent / "results" / "jacobian_spectra.md"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def top_err(values: np.ndarray, dense: np.ndarray, k: int = 16) -> float:
    """Conjugate-invariant error of the top-k: max relative error of sorted moduli."""
    a = np.sort(np.abs(values))[::-1][:k]
    b = np.sort(np.abs(dense))[::-1][:k]
    return float(np.max(np.abs(a - b) / b[0]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="*", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jacrev-layers", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=RESULTS)
    opt = ap.parse_args()
    torch.set_num_threads(2)
    from scipy.sparse.linalg import LinearOperator as SciOp
    from scipy.sparse.linalg import eigs as arpack
    from scipy.sparse.linalg import ArpackNoConvergence
    from transformers import GPT2Config, GPT2Model

    import spectral_hooks as sh
    from spectral_hooks.linalg import eigs
    from spectral_hooks.linearize import block_function, block_jacobian

    layers = opt.layers if opt.layers is not None else ([0, 11] if opt.quick else list(range(12)))
    rounds = 3 if opt.quick else opt.rounds
    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(n_layer=12, n_embd=768, n_head=12)).eval()
    ids = torch.randint(0, 50257, (1, opt.tokens), generator=torch.Generator().manual_seed(1))
    with sh.instrument(model) as probe, torch.no_grad():
        model(ids)
    anat, rec = probe.anatomy, probe.recording
    d = anat.d_model

    def forward_time() -> float:
        t = time.perf_counter()
        with torch.no_grad():
            model(ids)
        return time.perf_counter() - t

    forward_time()

    # ---------------------------------------------------------------- per-matvec costs, interleaved
    def user_matvec(layer: int):
        """What a user writes: a full-sequence jvp of the block, last row read off."""
        call = rec.block_input(layer)
        block = anat.layers[layer].block
        H0 = call.hidden

        def f1(H):
            args, kwargs = call.with_hidden(H)
            out = block(*args, **kwargs)
            return out[0] if isinstance(out, tuple) else out

        def mv(v):
            t = torch.zeros_like(H0)
            t[0, -1] = torch.as_tensor(v, dtype=H0.dtype)
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
                return torch.func.jvp(f1, (H0,), (t,))[1][0, -1].double().numpy()
        return mv

    probe_layer = layers[len(layers) // 2]
    J_probe = block_jacobian(anat, rec, probe_layer, dtype=torch.float32)
    umv = user_matvec(probe_layer)
    x = torch.randn(d)
    J_probe.matvec(x), umv(x.numpy())
    t_fwd, t_ours_mv, t_user_mv = [], [], []
    for _ in range(rounds):
        t_fwd.append(forward_time())
        t = time.perf_counter()
        for _ in range(5):
            J_probe.matvec(x)
        t_ours_mv.append((time.perf_counter() - t) / 5)
        t = time.perf_counter()
        umv(x.numpy())
        t_user_mv.append(time.perf_counter() - t)
    fwd = statistics.median(t_fwd)
    mv_ratio = [u / o for u, o in zip(t_user_mv, t_ours_mv)]

    # ---------------------------------------------------------------- ours, end to end, every layer
    ours = {}
    rss_before = rss_mb()
    for layer in layers:
        fwd_l = forward_time()
        t = time.perf_counter()
        J = block_jacobian(anat, rec, layer, dtype=torch.float32)
        res = eigs(J, 16, tol=1e-5, seed=0, max_restarts=200)
        wall = time.perf_counter() - t
        ours[layer] = dict(wall=wall, fwd=fwd_l, n=res.n_matvecs, conv=bool(res.converged),
                           values=res.values.flatten().numpy(),
                           single_query=J.single_query)
        print(f"ours layer {layer}: {wall:.1f}s {res.n_matvecs} matvecs conv={res.converged}",
              flush=True)
    rss_ours = rss_mb()

    # ---------------------------------------------------------------- ARPACK matvec counts
    arp = {}
    for layer in layers:
        J = block_jacobian(anat, rec, layer, dtype=torch.float32)
        for label, ncv in (("default", None), ("ncv=96", 96)):
            count = [0]

            def mv(v, J=J, count=count):
                count[0] += 1
                return J.matvec(torch.as_tensor(np.real(v), dtype=torch.float32)).double().numpy()

            op = SciOp((d, d), matvec=mv, dtype=np.float64)
            t = time.perf_counter()
            try:
                vals = arpack(op, k=16, which="LM", ncv=ncv, tol=1e-5,
                              return_eigenvectors=False, v0=np.ones(d) / np.sqrt(d))
            except ArpackNoConvergence as err:
                vals = err.eigenvalues
            arp[(layer, label)] = dict(n=count[0], values=vals, wall_on_ours=time.perf_counter() - t)
    # ---------------------------------------------------------------- jacrev + eig (timed, last)
    jr = {}
    for layer in layers[: opt.jacrev_layers]:
        call = rec.block_input(layer)
        block = anat.layers[layer].block
        H0 = call.hidden[0]

        def g(xp, call=call, block=block, H0=H0):
            H = torch.cat([H0[:-1], xp[None]])[None]
            args, kwargs = call.with_hidden(H)
            out = block(*args, **kwargs)
            return (out[0] if isinstance(out, tuple) else out)[0, -1]

        t = time.perf_counter()
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.MATH):
            Jd = torch.func.jacrev(g)(H0[-1]).detach()
        vals = torch.linalg.eigvals(Jd)
        jr[layer] = dict(wall=time.perf_counter() - t, values=vals.numpy())
        print(f"jacrev+eig layer {layer}: {jr[layer]['wall']:.1f}s", flush=True)
    rss_jacrev = rss_mb()

    # ---------------------------------------------------------------- dense oracle (after timing)
    dense = {}
    for layer in layers:
        J64 = block_jacobian(anat, rec, layer, dtype=torch.float64)
        D = J64.matmat(torch.eye(d, dtype=torch.float64))
        dense[layer] = torch.linalg.eigvals(D).numpy()

    # ---------------------------------------------------------------- table
    L = len(layers)
    ours_total = sum(o["wall"] for o in ours.values())
    ours_n = sum(o["n"] for o in ours.values())
    user_mv = statistics.median(t_user_mv)
    lines = [
        "# Jacobian spectra benchmark (top-16 eigenvalues, last-token block Jacobian)",
        "",
        f"GPT-2-small-sized random init (12 layers, d=768, 12 heads), {opt.tokens} tokens, float32 "
        f"model, torch threads = {torch.get_num_threads()}, CPU (2 cores, shared machine). "
        f"Layers measured: {layers}. Command: `python benchmarks/jacobian_spectra.py"
        f"{' --quick' if opt.quick else ''}`.",
        "",
        f"One plain forward of the whole model (median of {rounds}): {fwd * 1e3:.0f} ms.",
        "",
        "## Per matvec (interleaved, layer %d, %d rounds)" % (probe_layer, rounds),
        "",
        "| matvec | median ms | forward-equivalents |",
        "|---|---|---|",
        f"| ours (single-query, linearized, float32) | {statistics.median(t_ours_mv) * 1e3:.1f} | "
        f"{statistics.median(t_ours_mv) / fwd:.3f} |",
        f"| user: full-sequence torch.func.jvp | {user_mv * 1e3:.1f} | {user_mv / fwd:.3f} |",
        "",
        f"Ratio user/ours per round: median {statistics.median(mv_ratio):.1f}x "
        f"(min {min(mv_ratio):.1f}, max {max(mv_ratio):.1f}).",
        "",
        f"## End to end over {L} layer(s)",
        "",
        "| method | wall s | matvecs | forward-equivalents | top-16 error vs dense (max) | how |",
        "|---|---|---|---|---|---|",
    ]
    err_ours = max(top_err(o["values"], dense[l]) for l, o in ours.items())
    conv = all(o["conv"] for o in ours.values())
    lines.append(f"| ours: eigs(block_jacobian) | {ours_total:.1f} | {ours_n} | "
                 f"{ours_total / fwd:.0f} | {err_ours:.1e} (converged: {conv}) | measured |")
    for label in ("default", "ncv=96"):
        n = sum(arp[(l, label)]["n"] for l in layers)
        err = max(top_err(arp[(l, label)]["values"], dense[l]) for l in layers)
        wall = n * user_mv
        lines.append(f"| user ARPACK eigs(k=16, {label}) over full-seq jvp | {wall:.0f} | {n} | "
                     f"{wall / fwd:.0f} | {err:.1e} | matvecs measured x measured user matvec |")
    for label in ("default", "ncv=96"):
        n = sum(arp[(l, label)]["n"] for l in layers)
        w = sum(arp[(l, label)]["wall_on_ours"] for l in layers)
        lines.append(f"| ARPACK ({label}) over OUR operator | {w:.1f} | {n} | {w / fwd:.0f} | "
                     f"(as above) | measured |")
    if jr:
        per = statistics.mean(j["wall"] for j in jr.values())
        err = max(top_err(j["values"], dense[l]) for l, j in jr.items())
        lines.append(f"| jacrev + eigvals | {per * L:.0f} | {d} VJPs/layer | {per * L / fwd:.0f} | "
                     f"{err:.1e} | {len(jr)} layer(s) timed ({per:.1f} s each), x{L} |")
    lines += [
        "",
        f"Speed-up of ours end to end: {sum(arp[(l, 'ncv=96')]['n'] for l in layers) * user_mv / ours_total:.1f}x "
        f"vs user ARPACK at ncv=96, "
        f"{sum(arp[(l, 'default')]['n'] for l in layers) * user_mv / ours_total:.1f}x vs user ARPACK "
        f"defaults" + (f", {statistics.mean(j['wall'] for j in jr.values()) * L / ours_total:.1f}x vs "
                       "jacrev + eig" if jr else "") + ".",
        f"Matvecs ours / ARPACK(ncv=96) on the same operator: "
        f"{ours_n / max(1, sum(arp[(l, 'ncv=96')]['n'] for l in layers)):.2f}.",
        "",
        f"Peak RSS (process, monotonic): {rss_before:.0f} MB before ours, {rss_ours:.0f} MB after "
        f"ours, {rss_jacrev:.0f} MB after jacrev + eig.",
        "",
        "Per layer (ours): " + ", ".join(
            f"L{l}: {o['wall']:.1f}s/{o['n']}mv" for l, o in ours.items()),
        "",
        "Per layer top-16 error (ours / ARPACK default / ARPACK ncv=96): " + ", ".join(
            f"L{l}: {top_err(ours[l]['values'], dense[l]):.0e}/"
            f"{top_err(arp[(l, 'default')]['values'], dense[l]):.0e}/"
            f"{top_err(arp[(l, 'ncv=96')]['values'], dense[l]):.0e}" for l in layers),
    ]
    opt.out.parent.mkdir(parents=True, exist_ok=True)
    opt.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
