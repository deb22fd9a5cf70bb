"""Benchmark (issue 24): what one ``eigs`` call on a Llama block Jacobian costs in GPU terms,
counted on the CPU, and a time model that turns the counts into a projected H200 time.

Per ``eigs`` call (top-16 of a Llama-shaped block's last-token Jacobian, float64 operator,
tol 1e-8) and per solver shape (one column per step, ``materialize=False``: the CPU default;
``block_size=32/64``: the shape an accelerator gets by default), counted with
``torch.profiler`` on the CPU:

* column applications (``n_matvecs``) and sequential operator applications (calls of the
  operator's matmat: on a GPU each is one pass of the JVP graph, whatever its width),
* host syncs: ``aten::_local_scalar_dense`` (every ``.item()`` / ``float(t)`` / ``bool(t)`` /
  ``.tolist()`` of a tensor), split into the solver's and the operator's own,
* top-level aten ops of the solver (each one or more kernel launches on a GPU; the operator's
  own ops are inside a ``record_function("operator")`` range and counted per application).

Time model (H200 SXM, float64; see benchmarks/results/launch_budget.md):
``T = launches * LAUNCH + syncs * SYNC + flops / FP64 + bytes / HBM`` with LAUNCH = 86 us of
host time per kernel launch (recalibrated, issue 37, on the measured 2026-12-04 H200 profile:
``eigs`` 2.53 s of host time for 29,378 launches; it was 5 us, CUDA's launch overhead alone,
which made the model 5.6-8x too optimistic),
SYNC = 15 us per host sync (a device-to-host copy of a scalar and the pipeline drain it
forces), FP64 = 67 TFLOP/s (H200 dense float64 tensor core peak; 34 TFLOP/s vector) and HBM =
4.8 TB/s (HBM3e). The operator's cost per application is taken from its FLOPs and weight
bytes (one pass over the block's weights per application, at most one launch per aten op of a
one-column application as counted here). Llama-3-8B: d=4096, GQA 32/8, ffn 14336, 32 layers.

Measured on an H200 (2026-12-04, benchmarks/RESULTS.md "GPU path"): the model is 5.6-8x too
optimistic (jacobian section 145 s, 103 s with CUDA-graph JVPs, against 18.3 s projected). A
launch there costs 41-86 us of host time (Python, dispatch and the launch; ``eigs`` 2.53 s of
host time for 29,378 launches and 0.32 s of GPU kernels), not 5 us: the solvers are
host-bound, so count launches and syncs, and charge ~40-90 us each, for a real projection.

    python benchmarks/launch_budget.py [--quick] [--widths 1024 2048 4096] [--tokens 128]
    python benchmarks/launch_budget.py --proxy [--out FILE]     # per solver call, d=128 proxy
    python benchmarks/launch_budget.py --table FILE [--proxy]  # markdown of a JSONL file

``--quick``: d = 1024 only, the eigs counts (no full-section run). d = 4096 runs with 32 tokens
(``--tokens-4096``: CPU memory and time; the operator's FLOPs hardly depend on the tokens).
One torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import torch  # noqa: E402
from jsonl import append_jsonl  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

K, TOL = 16, 1e-8
#: s of host time per kernel launch: measured on an H200 (2026-12-04 profile, ``eigs``: 2.53 s
#: of host time for 29,378 launches = 86 us; ``svds`` 41 us), not the 5 us first assumed
LAUNCH = 86e-6
SYNC = 15e-6                        # s per host sync (see module doc)
FP64, HBM = 67e12, 4.8e12           # H200: dense float64 tensor-core FLOP/s, HBM3e bytes/s
SHAPES = {128: (4, 1, 448), 1024: (8, 2, 3584), 2048: (16, 4, 7168), 4096: (32, 8, 14336)}


def build(d: int, tokens: int, layers: int = 1, shape: tuple = ()):
    """A Llama-shaped model at random init (offline config), instrumented, one forward.
    ``shape``: (heads, kv heads, MLP width); default ``SHAPES[d]``."""
    from transformers import LlamaConfig, LlamaModel

    import spectral_hooks as sh

    heads, kv, ffn = shape or SHAPES[d]
    cfg = LlamaConfig(hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=d // heads,
                      vocab_size=1000, max_position_embeddings=max(8192, tokens),
                      rope_theta=500000.0, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0,
                      pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaModel(cfg).eval()
    ids = torch.randint(0, 1000, (1, tokens), generator=torch.Generator().manual_seed(1))
    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=ids)
    return model, probe


def block_flops_bytes(d: int, tokens: int, dtype_bytes: int = 8) -> tuple:
    """FLOPs and weight bytes of one single-query JVP column of a Llama block (last token):
    the projections and the MLP (2 flops per weight), attention over ``tokens`` keys."""
    heads, kv, ffn = SHAPES[d]
    hd = d // heads
    weights = d * d + 2 * d * kv * hd + d * d + 3 * d * ffn
    flops = 2 * weights + 4 * tokens * d
    return flops, weights * dtype_bytes


#: Tensor methods that read a tensor's values into Python: on an accelerator each is a host
#: sync (a device-to-host copy and the pipeline drain). On the CPU ``.tolist()`` and ``.cpu()``
#: leave no ``_local_scalar_dense`` in the profile, so they are counted here by name.
READS = ("tolist", "item", "__bool__", "__float__", "__int__", "cpu", "numpy")


class Reads:
    """Counts calls of :data:`READS` outside the operator (``Counted.inside``) while active.
    An upper bound of a GPU's host syncs: reads of a host copy (the projected problem a solver
    solves on the host) are counted too, though on a GPU they touch no device."""

    def __init__(self, counted=None):
        self.counted, self.n, self.saved = counted, 0, {}

    def __enter__(self):
        for name in READS:
            f = getattr(torch.Tensor, name)
            self.saved[name] = f

            def g(t, *a, _f=f, **kw):
                if self.counted is None or not self.counted.inside:
                    self.n += 1
                return _f(t, *a, **kw)
            setattr(torch.Tensor, name, g)
        return self

    def __exit__(self, *exc):
        for name, f in self.saved.items():
            setattr(torch.Tensor, name, f)


class Counted:
    """Wraps an operator's matmat/matvec: counts sequential applications and puts each in a
    ``record_function("operator")`` range (so its ops are not top-level solver ops)."""

    def __init__(self, op):
        self.op, self.calls, self.inside = op, 0, False
        for name in ("_matmat", "_matvec", "_rmatmat", "_rmatvec"):
            f = getattr(op, name, None)
            if f is not None:
                setattr(op, name, self._wrap(f))

    def _wrap(self, f):
        def g(X):
            self.calls += 1
            self.inside = True
            try:
                with record_function("operator"):
                    return f(X)
            finally:
                self.inside = False
        return g


#: small projected problems a solver solves on the host (on an accelerator, on a host copy):
#: the reads inside their CPU kernels' workspace queries never touch a device
HOST_SOLVES = ("aten::linalg_eig", "aten::_linalg_svd", "aten::linalg_svd")


def count(fn) -> dict:
    """Run fn under the profiler. Host syncs (``aten::_local_scalar_dense``) split three ways:
    the operator's own (inside its record_function range), the CPU eig's workspace queries
    (inside ``aten::linalg_eig``: on an accelerator eigs solves the small projected problem on
    a host copy, so these never touch the device), and the solver's (the ones a GPU pays)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    events = prof.events()

    def inside(e, name) -> bool:
        p = e.cpu_parent
        while p is not None:
            if p.name == name:
                return True
            p = p.cpu_parent
        return False
    top = [e for e in events if e.cpu_parent is None and e.name.startswith("aten::")]
    syncs = [e for e in events if e.name == "aten::_local_scalar_dense"]
    op_syncs = sum(inside(e, "operator") for e in syncs)
    eig_syncs = sum(any(inside(e, f) for f in HOST_SOLVES) and not inside(e, "operator")
                    for e in syncs)
    return dict(out=out, solver_syncs=len(syncs) - op_syncs - eig_syncs,
                host_eig_reads=eig_syncs, operator_syncs=op_syncs, solver_top_ops=len(top),
                all_top_ops=len(top) + sum(e.cpu_parent is not None and e.cpu_parent.name ==
                                           "operator" for e in events))


def projected(c: dict, d: int, tokens: int, op_launches: int) -> float:
    """Seconds on an H200 for one eigs call with counts ``c`` (see the module doc): every
    solver top-level op one launch, every operator application ``op_launches`` launches plus
    one pass over the block's float64 weights, the FLOPs of every column at the fp64 rate,
    every solver and operator sync one stall."""
    flops, nbytes = block_flops_bytes(d, tokens)
    apps = c["applications"]
    operator = apps * (op_launches * LAUNCH + nbytes / HBM) + c["n_matvecs"] * flops / FP64
    return operator + c["solver_top_ops"] * LAUNCH + \
        (c["solver_syncs"] + c["operator_syncs"]) * SYNC


def eigs_counts(d: int, tokens: int, shapes, out_rows: list, section: bool) -> None:
    from spectral_hooks.linalg import eigs

    model, probe = build(d, tokens)
    J = probe.jacobian(0)
    n = J.shape[0]
    for width in (64, 32):  # build the traced graphs first (32 and 64 columns: one each,
        J.matmat(torch.randn(n, width, dtype=torch.float64))  # shared by a model's layers)
    J.matmat(torch.randn(n, 1, dtype=torch.float64))
    # ops of one one-column application (kernel launches per application on a GPU)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        J.matmat(torch.randn(n, 1, dtype=torch.float64))
    op_ops = sum(1 for e in prof.events() if e.name.startswith("aten::"))
    counted = Counted(J)

    def emit(row):
        row.update(torch=torch.__version__, threads=torch.get_num_threads(),
                   load_avg_1min=round(os.getloadavg()[0], 2),
                   date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        out_rows.append(row)
        print(json.dumps(row), flush=True)
    for label, kw in shapes:
        counted.calls = 0
        t = time.perf_counter()
        c = count(lambda: eigs(J, K, tol=TOL, **kw))
        c["cpu_wall_profiled_s"] = round(time.perf_counter() - t, 3)
        res = c.pop("out")
        c.update(applications=counted.calls, n_matvecs=res.n_matvecs,
                 converged=bool(res.converged), operator_ops_per_application=op_ops)
        if kw == dict(materialize=False):  # one column a step, timed without the profiler too
            t = time.perf_counter()
            eigs(J, K, tol=TOL, **kw)
            c["cpu_wall_s"] = round(time.perf_counter() - t, 3)
        c["h200_projected_s"] = round(projected(c, d, tokens, op_ops), 4)
        emit(dict(what="eigs call", d=d, tokens=tokens, k=K, tol=TOL, shape=label, **c))
    if section:  # a full jacobian section (1 layer): eigs + the section's svds / estimators
        t = time.perf_counter()
        c = count(lambda: probe.analyze(power=False, progress=False,
                                        jacobian={"k": K, "dense": False}).jacobian)
        c["cpu_wall_profiled_s"] = round(time.perf_counter() - t, 3)
        table = c.pop("out")
        c["n_matvecs"] = int(table["n_matvecs"].sum()) if "n_matvecs" in table else None
        emit(dict(what="jacobian section (1 layer, dense=False, CPU default)", d=d,
                  tokens=tokens, k=K, **c))
    probe.remove()


def proxy_counts(out_rows: list, tokens: int = 64, k: int = 16, tol: float = 1e-10) -> None:
    """Per solver call of the jacobian section on the CPU proxy (issue 37: Llama-shaped d=128,
    GQA 4/1, head dim 32, ffn 448, 64 tokens, one layer's last-token Jacobian as a float64
    operator, the section's k=16 and tol): eigs, svds(J), svds(J - I) at their defaults and in
    the accelerator's shape, and the section's Hutchinson products. The operator's own ops
    are excluded (record_function range); syncs are the solver's."""
    from spectral_hooks.linalg import IdentityOperator, eigs, svds

    model, probe = build(128, tokens)
    J = probe.jacobian(0)
    for width in (1, 16, 32, 64, 128):  # the traced graphs are a model's, not a call's
        J.matmat(torch.randn(128, width, dtype=torch.float64))
        J.rmatmat(torch.randn(128, width, dtype=torch.float64))
    counted = Counted(J)
    delta = J - IdentityOperator(128, dtype=J.dtype, device=J.device)
    calls = [("eigs(J) default", lambda: eigs(J, k, tol=tol, return_vectors=False)),
             ("eigs(J) block_size=32 (accelerator shape)",
              lambda: eigs(J, k, tol=tol, return_vectors=False, block_size=32)),
             ("svds(J) default", lambda: svds(J, k, tol=tol, return_vectors=False)),
             ("svds(J - I) default", lambda: svds(delta, k, tol=tol)),
             ("svds(J) block_size=1", lambda: svds(J, k, tol=tol, block_size=1,
                                                   return_vectors=False))]
    for label, fn in calls:
        fn()  # warm
        counted.calls = 0
        t = time.perf_counter()
        c = count(fn)
        wall = time.perf_counter() - t
        res = c.pop("out")
        applications = counted.calls
        with Reads(counted) as reads:
            fn()
        row = dict(what="proxy solver call", call=label, d=128, tokens=tokens, k=k, tol=tol,
                   host_reads=reads.n, applications=applications, n_matvecs=res.n_matvecs,
                   converged=bool(res.converged), cpu_wall_profiled_s=round(wall, 4), **c)
        t = time.perf_counter()
        fn()
        row["cpu_wall_s"] = round(time.perf_counter() - t, 4)
        row.update(torch=torch.__version__, threads=torch.get_num_threads(),
                   load_avg_1min=round(os.getloadavg()[0], 2),
                   date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        out_rows.append(row)
        print(json.dumps(row), flush=True)
    probe.remove()


def proxy_table(path: str) -> str:
    """Markdown table of the proxy rows of a JSON-lines file this script wrote."""
    rows = [json.loads(line) for line in open(path)]
    out = ["| date | call | columns | sequential applications | host reads (syncs on a GPU, "
           "upper bound) | `_local_scalar_dense` (+ inside the CPU eig/svd) | solver top-level "
           "aten ops | CPU s | converged |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["what"] == "proxy solver call":
            out.append(f"| {r['date']} | {r['call']} | {r['n_matvecs']} | {r['applications']} | "
                       f"{r.get('host_reads', 'n/a')} | "
                       f"{r['solver_syncs']} (+{r['host_eig_reads']}) | "
                       f"{r['solver_top_ops']:,} | {r['cpu_wall_s']} | {r['converged']} |")
    return "\n".join(out) + "\n"


def table(path: str) -> str:
    """Markdown table of a JSON-lines file this script wrote, and the Llama-3-8B projection:
    32 x (the d=4096 eigs call in the accelerator's default shape, block_size=32 = the JVP
    operator's hint + the rest of a jacobian section, i.e. the d=1024 section's counts minus
    its eigs call's, taken as launch- and sync-bound and unchanged with d)."""
    rows = [json.loads(line) for line in open(path)]
    for r in rows:  # the projection with this script's constants (LAUNCH was 5 us until issue 37)
        if r["what"] == "eigs call":
            r["h200_projected_s"] = round(projected(r, r["d"], r["tokens"],
                                                    r["operator_ops_per_application"]), 4)
    out = ["| d | tokens | shape | column applications | sequential applications | "
           "host syncs: solver + operator (host eig reads) | top-level aten ops: solver / "
           "with the operator's | CPU s (profiled) | H200 projected s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["what"] != "eigs call":
            continue
        wall = r.get("cpu_wall_s")
        wall = f"{wall} ({r['cpu_wall_profiled_s']})" if wall else f"({r['cpu_wall_profiled_s']})"
        out.append(f"| {r['d']} | {r['tokens']} | {r['shape']} | {r['n_matvecs']} | "
                   f"{r['applications']} | {r['solver_syncs']} + {r['operator_syncs']} "
                   f"({r['host_eig_reads']}) | {r['solver_top_ops']:,} / {r['all_top_ops']:,} | "
                   f"{wall} | {r['h200_projected_s']} |")
    sec = [r for r in rows if r["what"].startswith("jacobian section")]
    e1 = [r for r in rows if r["what"] == "eigs call" and r["d"] == 1024
          and r["shape"].startswith("cpu default")]
    e4 = [r for r in rows if r["what"] == "eigs call" and r["d"] == 4096
          and r["shape"] == "block_size=32"]
    if sec and e1 and e4:
        s, e = sec[-1], e1[-1]
        ops = s["all_top_ops"] - e["all_top_ops"]
        syncs = s["solver_syncs"] + s["operator_syncs"] - e["solver_syncs"] - e["operator_syncs"]
        mv = s["n_matvecs"] - e["n_matvecs"]
        flops, nbytes = block_flops_bytes(4096, 512)
        rest = ops * LAUNCH + syncs * SYNC + mv * (flops / FP64 + nbytes / HBM)
        layer = e4[-1]["h200_projected_s"] + rest
        out += ["", f"Jacobian section, d=1024, 1 layer, CPU default: {s['n_matvecs']} "
                f"column applications, {s['solver_syncs'] + s['operator_syncs']} host syncs, "
                f"{s['all_top_ops']:,} top-level aten ops, {s['cpu_wall_profiled_s']} s "
                "(profiled); beyond its eigs call: "
                f"{mv} columns, {syncs} syncs, {ops:,} ops (svds, estimators, operator builds).",
                f"Projected Llama-3-8B jacobian section on an H200 (32 layers): 32 x "
                f"({e4[-1]['h200_projected_s']:.3f} s eigs + {rest:.3f} s rest) = "
                f"**{32 * layer:.1f} s**."]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", default=None, help="print the markdown table of a JSONL file")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--widths", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--tokens-4096", type=int, default=32,
                    help="tokens at d=4096 (CPU memory and time)")
    ap.add_argument("--out", default=None, help="append the JSON lines to this file")
    ap.add_argument("--proxy", action="store_true",
                    help="per solver call on the CPU proxy (d=128, 64 tokens; issue 37)")
    args = ap.parse_args()
    if args.table:
        print(proxy_table(args.table) if args.proxy else table(args.table))
        return
    torch.set_num_threads(1)
    if args.proxy:
        rows: list = []
        proxy_counts(rows)
        append_jsonl(args.out, rows)
        return
    widths = [1024] if args.quick else args.widths
    shapes = [("cpu default (1 column)", dict(materialize=False)), ("block_size=32", dict(block_size=32)),
              ("block_size=64", dict(block_size=64))]
    rows: list = []
    for d in widths:
        eigs_counts(d, args.tokens_4096 if d == 4096 else args.tokens, shapes, rows,
                    section=(d == 1024 and not args.quick))
    append_jsonl(args.out, rows)


if __name__ == "__main__":
    main()
