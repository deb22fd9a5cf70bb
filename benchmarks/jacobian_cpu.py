"""The Jacobian view of a 1B model on a CPU (issue 57): where a layer's operator applications
go, and ``analyze(jacobian=True)`` at the CPU defaults on the Llama-3.2-1B shape.

    python benchmarks/jacobian_cpu.py             # parts of 2 layers, both routes; the whole
                                                  # 16-layer analyze(jacobian=True); ~8 min
    python benchmarks/jacobian_cpu.py --quick     # parts of 1 layer; analyze on 2 layers; ~2 min

The shape: Llama-3.2-1B (d_model 2048, 16 layers, 32 heads, 8 KV heads, head_dim 64, MLP width
8192) at random init, built offline from a LlamaConfig, float32; vocabulary 1000 (the block
Jacobians read only the blocks' weights and the recorded inputs: the embedding is not in
them). One batch of 2 x 64 tokens. One torch / BLAS thread (``--threads``).

``parts`` (per measured layer, each route on the same operator): the jacobian section's
matrix-free work, part by part (``metrics/jacobian.py``), with the columns applied
(``n_matvecs``), the sequential applications of J and of J^T (calls of matmat / rmatmat) and
the seconds:

* route "operator" (Krylov on the operator, the only route before issue 57): eigs(J, k),
  svds(J, k) (a field no column of the table reads: the section skips it now), svds(J - I, k),
  the Hutchinson probes (``n_samples`` of them, 4 products);
* route "matrix" (``JacobianOptions.materialize``, the CPU default from d_model = 512 below
  ~3750): J formed from d columns in 128-column products, eigs on it with every pair checked
  with fresh products of J, svds(J - I) on it with its triplets checked the same way, the same
  Hutchinson probes on the matrix.

Then the values of both routes side by side (eigenvalues, self_alignment, the estimates).

``analyze``: ``probe.analyze(jacobian=True)`` with the defaults (power view included), every
table read (jacobian, trends, spectra), timed end to end from a fresh probe, with the
report's section timings and its ``jacobian`` metadata (which route, and why). ``--before``
also times the section with ``materialize=False`` on ``--before-layers`` layers (the rest of
the route before is what ``parts`` counts).

Results are appended to benchmarks/results/jacobian_cpu.md with ``uptime``'s load.
"""

from __future__ import annotations

import os
import sys

_THREADS = 1
for _i, _a in enumerate(sys.argv):
    if _a == "--threads" and _i + 1 < len(sys.argv):
        _THREADS = int(sys.argv[_i + 1])
for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_v] = str(_THREADS)  # before numpy / torch load their BLAS

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "jacobian_cpu.md"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="parts of 1 layer; analyze on a 2-layer model of the shape")
    p.add_argument("--layers", type=int, default=16, help="layers of the model analysed")
    p.add_argument("--parts-layers", type=int, default=2, help="layers measured part by part")
    p.add_argument("--k", type=int, default=16, help="k of the parts (the section's default)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-parts", action="store_true")
    p.add_argument("--skip-analyze", action="store_true")
    p.add_argument("--before", action="store_true",
                   help="also time the jacobian section with materialize=False")
    p.add_argument("--before-layers", type=int, default=2)
    p.add_argument("--ab", type=int, default=0, metavar="ROUNDS",
                   help="interleaved rounds of one layer's metrics, operator vs matrix route "
                        "(jacobian_metrics as the section calls it; ratios hold under load)")
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.parts_layers = 2, 1
    return args


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def build(layers: int, tokens: int, batch: int):
    """The Llama-3.2-1B shape at random init with ``layers`` layers, and its input ids."""
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(num_hidden_layers=layers, vocab_size=1000, max_position_embeddings=2048,
                         hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64)
    torch.manual_seed(0)
    model = LlamaModel(config).eval()
    ids = torch.randint(0, 1000, (batch, tokens), generator=torch.Generator().manual_seed(1))
    return model, ids


def recorded(model, ids) -> Any:
    import spectral_hooks as sh

    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=ids)
    return probe


def _counted():
    spec = importlib.util.spec_from_file_location("jacobian_parts", HERE / "jacobian_parts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Counted


# ----------------------------------------------------------------------------- parts


def operator_parts(op, k: int, n_samples: int, found: dict):
    """The section's parts on the operator (the route before issue 57)."""
    from spectral_hooks.linalg import IdentityOperator, eigs, svds
    from spectral_hooks.metrics import jacobian as metrics
    from spectral_hooks.metrics.rotation import top_k_by_modulus

    delta = op - IdentityOperator(op.shape[0], dtype=op.dtype, device=op.device)

    def eig():
        found["eigs"] = eigs(op, k, tol=1e-8, seed=0, return_vectors=False)

    def svd_delta():
        found["svds"] = svds(delta, k, tol=1e-8, seed=3)

    def hutch():
        found["hutchinson"] = metrics._hutchinson(
            op, n_samples, 4, top_k_by_modulus(found["eigs"].values, k))
    yield "eigs(J)", eig
    yield "svds(J) (unread; skipped now)", lambda: svds(op, k, tol=1e-8, seed=2,
                                                      return_vectors=False)
    yield "svds(J-I)", svd_delta
    yield f"hutchinson ({n_samples} probes)", hutch


def matrix_parts(op, k: int, n_samples: int, found: dict):
    """The same parts from J's matrix (``JacobianOptions.materialize``)."""
    from spectral_hooks.linalg import DenseOperator, IdentityOperator, eigs, svds
    from spectral_hooks.linalg.materialize import matrix_of, svd_residuals
    from spectral_hooks.metrics import jacobian as metrics
    from spectral_hooks.metrics.rotation import top_k_by_modulus

    delta = op - IdentityOperator(op.shape[0], dtype=op.dtype, device=op.device)

    def form():
        found["J"] = matrix_of(op)

    def eig():
        found["eigs"] = eigs(op, k, tol=1e-8, seed=0, return_vectors=False,
                             materialize=found["J"])

    def svd_delta():
        J = found["J"]
        found["svds"] = svds(J - torch.eye(J.shape[0], dtype=J.dtype), k, tol=1e-8, seed=3)

    def check():
        found["svd_check"] = float(svd_residuals(delta, found["svds"]).max())

    def hutch():
        found["hutchinson"] = metrics._hutchinson(
            DenseOperator(found["J"]), n_samples, 4, top_k_by_modulus(found["eigs"].values, k))
    yield "form J (d columns, 128 a product)", form
    yield "eigs on J + fresh check", eig
    yield "svds(J-I) on J", svd_delta
    yield "svds check (fresh products)", check
    yield f"hutchinson ({n_samples} probes) on J", hutch


def run_parts(probe, layer: int, k: int, n_samples: int, Counted) -> tuple[list[dict], dict]:
    rows, values = [], {}
    for route, parts in (("operator", operator_parts), ("matrix", matrix_parts)):
        op = probe.jacobian(layer)
        counted = Counted(op)
        op._need_adjoint()
        found: dict = {}
        for name, run in parts(op, k, n_samples, found):
            before, n0 = dict(counted.calls), op.n_matvecs
            t0 = time.perf_counter()
            run()
            rows.append(dict(layer=layer, route=route, part=name,
                             seconds=time.perf_counter() - t0, columns=op.n_matvecs - n0,
                             forward=counted.calls["forward"] - before["forward"],
                             adjoint=counted.calls["adjoint"] - before["adjoint"]))
        values[route] = found
    return rows, values


def compare(values: dict, k: int) -> dict[str, float]:
    """How far the matrix route's values are from the operator route's."""
    from spectral_hooks.metrics.jacobian import self_alignment_of
    from spectral_hooks.metrics.rotation import top_k_by_modulus

    a, b = values["operator"], values["matrix"]
    la = top_k_by_modulus(a["eigs"].values, k)
    lb = top_k_by_modulus(b["eigs"].values, k)
    sa, sb = a["svds"], b["svds"]
    out = {"top-k |lambda| max rel diff": float(((la.abs() - lb.abs()).abs() / la.abs()).max()),
           "svds(J-I) values max rel diff": float(((sa.S - sb.S).abs() / sa.S).max()),
           "self_alignment diff": abs(self_alignment_of(sa.U, sa.Vh, k)
                                      - self_alignment_of(sb.U, sb.Vh, k)),
           "max eig residual (fresh, matrix route)": float(b["eigs"].residuals.max()),
           "max svd residual (fresh, matrix route)": b["svd_check"],
           "converged (matrix route)": float(bool(b["eigs"].converged)
                                             and bool(b["svds"].converged))}
    for key in ("sym_energy", "commutator", "departure_rel_upper", "departure_rel_lower"):
        out[f"{key} diff (se {a['hutchinson'][key + '_se']:.1e})"] = abs(
            a["hutchinson"][key] - b["hutchinson"][key])
    return out


def parts_section(args) -> list[str]:
    Counted = _counted()
    model, ids = build(args.parts_layers, args.tokens, args.batch)
    probe = recorded(model, ids)
    lines = [f"### parts: k = {args.k}, 64 Hutchinson probes, tol 1e-8, "
             f"{args.parts_layers} layer(s)", "",
             "| layer | route | part | columns | sequential J / J^T | seconds |",
             "|---|---|---|---|---|---|"]
    checks = []
    for layer in range(args.parts_layers):
        rows, values = run_parts(probe, layer, args.k, 64, Counted)
        for r in rows:
            lines.append(f"| {r['layer']} | {r['route']} | {r['part']} | {r['columns']} | "
                         f"{r['forward']} / {r['adjoint']} | {r['seconds']:.2f} |")
        for route in ("operator", "matrix"):
            mine = [r for r in rows if r["route"] == route]
            read = [r for r in mine if "skipped" not in r["part"]]
            lines.append(f"| {layer} | {route} | **total (what the section runs now)** | "
                         f"{sum(r['columns'] for r in read)} | "
                         f"{sum(r['forward'] for r in read)} / "
                         f"{sum(r['adjoint'] for r in read)} | "
                         f"**{sum(r['seconds'] for r in read):.2f}** |")
        checks.append((layer, compare(values, args.k)))
        print("\n".join(lines[-len(rows) - 2:]), flush=True)
    probe.remove()
    lines += ["", "Values, matrix route against operator route (same operator, same seeds):", ""]
    for layer, c in checks:
        lines.append(f"- layer {layer}: " + "; ".join(f"{k} {v:.2e}" for k, v in c.items()))
    return lines


# ----------------------------------------------------------------------------- A/B


def ab_section(args) -> list[str]:
    """One layer's metrics as the section computes them, operator then matrix route, in
    interleaved rounds (after one warm-up each: the JVP graphs' traces)."""
    import statistics

    from spectral_hooks.metrics.jacobian import jacobian_metrics

    model, ids = build(1, args.tokens, args.batch)
    probe = recorded(model, ids)
    op = probe.jacobian(0)
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.ab + 1):
        for materialize in (False, True):
            t0 = time.perf_counter()
            jacobian_metrics(op, k=args.k, n_samples=64, tol=1e-8, materialize=materialize,
                             singular_values=False)
            if r:
                times[materialize].append(time.perf_counter() - t0)
        print(f"round {r}: {load()}", flush=True)
    probe.remove()
    ratios = [b / a for a, b in zip(times[False], times[True])]
    return [f"### A/B, one layer (k = {args.k}), {args.ab} interleaved rounds after a warm-up",
            "", f"- operator route: {statistics.median(times[False]):.2f} s "
            f"({min(times[False]):.2f}-{max(times[False]):.2f})",
            f"- matrix route: {statistics.median(times[True]):.2f} s "
            f"({min(times[True]):.2f}-{max(times[True]):.2f})",
            f"- matrix / operator per round: {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f})"]


# ----------------------------------------------------------------------------- analyze


def timed_analyze(model, ids, jacobian: Any) -> tuple[float, Any, dict]:
    probe = recorded(model, ids)
    t0 = time.perf_counter()
    report = probe.analyze(jacobian=jacobian, progress=False)
    tables = {name: getattr(report, name) for name in ("jacobian", "trends", "spectra")}
    seconds = time.perf_counter() - t0
    probe.remove()
    return seconds, report, tables


def analyze_section(args) -> list[str]:
    model, ids = build(args.layers, args.tokens, args.batch)
    t_fwd = _time(lambda: recorded(model, ids).remove())
    seconds, report, tables = timed_analyze(model, ids, True)
    meta = report.metadata
    jac = tables["jacobian"]
    lines = [f"### analyze(jacobian=True), CPU defaults: {args.layers} layers", "",
             f"- **{seconds:.1f} s** end to end (every table read: jacobian, trends, spectra; "
             f"power view included); the recording forward {t_fwd:.2f} s before it",
             "- section timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in
                                               meta["timings_s"].items()),
             f"- jacobian rows: {len(jac)}, all converged: {bool(jac['converged'].all())}, "
             f"n_matvecs a layer {int(jac['n_matvecs'].min())}-{int(jac['n_matvecs'].max())}",
             f"- metadata jacobian.materialized = {meta['jacobian'].get('materialized')}: "
             f"{meta['jacobian'].get('materialized_why')}",
             f"- options: k {meta['options']['jacobian']['k']}, positions "
             f"{meta['options']['jacobian']['positions']}, n_samples "
             f"{meta['options']['jacobian']['n_samples']}, tol {meta['jacobian']['tol']}"]
    if args.before:
        lines += before_section(args, jac)
    return lines


def before_section(args, jac_now) -> list[str]:
    """The section with materialize=False (the route before) on a few layers, and its values
    against the default's."""
    import pandas as pd

    model, ids = build(args.before_layers, args.tokens, args.batch)
    rows = {}
    times = {}
    for name, choice in (("before (operator)", False), ("now (matrix)", None)):
        seconds, report, tables = timed_analyze(model, ids, {"materialize": choice})
        times[name] = report.metadata["timings_s"].get("section:jacobian", seconds)
        rows[name] = tables["jacobian"]
    a, b = rows["before (operator)"], rows["now (matrix)"]
    floats = [c for c in a.columns if pd.api.types.is_float_dtype(a[c])]
    worst = max(floats, key=lambda c: float((a[c] - b[c]).abs().max()))
    return ["", f"jacobian section on {args.before_layers} layers: " + ", ".join(
        f"{k} {v:.1f} s" for k, v in times.items()) + f"; largest difference of any float "
        f"column between them: {worst} {float((a[worst] - b[worst]).abs().max()):.2e}"]


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv=None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    import spectral_hooks  # noqa: F401  (imported before timing, as a user's script would)

    head = [f"## {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: Llama-3.2-1B shape, "
            f"{args.batch} x {args.tokens} tokens, {args.threads} thread(s)"
            + (" (--quick)" if args.quick else ""), "", f"load before: {load()}", ""]
    print("\n".join(head), flush=True)
    lines = list(head)
    if args.ab:
        lines += ab_section(args) + [""]
    if not args.skip_parts:
        lines += parts_section(args) + [""]
    if not args.skip_analyze:
        lines += analyze_section(args) + [""]
    lines += [f"load after: {load()}", f"torch {torch.__version__}", ""]
    print("\n".join(lines), flush=True)
    if not args.no_write:
        RESULTS.parent.mkdir(exist_ok=True)
        with RESULTS.open("a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
