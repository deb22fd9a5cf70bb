"""Benchmark (issue 37): the jacobian section on a narrow, deep model, where the wall time is
Python and dispatch, as a host-bound GPU's is: the CPU proxy for the accelerator's cost.

The proxy: a Llama-shaped model at random init (offline ``LlamaConfig``, seeded), d=128, GQA
4 heads / 1 key-value head (head dim 32), MLP 448, 64 tokens, 8 layers, one torch thread; and
the same shape family at d=1024 (GQA 8/2, head dim 128, MLP 3584) with 4 layers. The section
timed is the matrix-free one, ``probe.analyze(jacobian={"k": 16, "dense": False})`` (the path
every model above d = 1024 takes by default), from a fresh probe (its own cache).

Per layer (the section's totals divided by the layers) it reports:

* ``applications``: sequential operator applications (calls of a block's JVP / VJP machinery,
  ``linearize.engine.Engine.jvp`` / ``.vjp``, or of a layer group's batched products: on an
  accelerator each costs about one pass of the JVP graph whatever its width);
* ``solver_ops``: top-level aten ops outside the operator's graph (each application runs inside
  a ``record_function("operator")`` range, so its ops are not top-level): the solvers', the
  estimators' and the section's own; ``total_ops``: those plus the operator's top-level ops;
* ``syncs``: host syncs, counted as this project counts them (``benchmarks/launch_budget.py``):
  ``aten::_local_scalar_dense`` (every ``.item()`` / ``float(t)`` / ``bool(t)``) and
  ``aten::nonzero`` outside host-side work (``HOST_RANGES``: LAPACK's workspace reads inside a
  CPU eig/svd of a projected problem, and the library's ``record_function("spectral_hooks.host")``
  blocks, which read host copies), plus every ``.tolist()`` / ``.numpy()`` / ``.cpu()`` call
  (on an accelerator a device-to-host copy; on the CPU no profiler event, so counted by name:
  an upper bound); the host-side reads are reported apart (``host_eig_reads``);
* ``cold_*``: the same counts for the first section run of a process (the JVP graphs traced
  inside it; the traced-graph cache is cleared before);
* ``seconds``: wall time, measured without the profiler (``--rounds`` runs, median);
  ``cold_seconds``: the first run in the process, which also traces the JVP graphs;
* ``forward_equivalents``: seconds / one plain forward of the whole model (median of 20, taken
  in the same run, interleaved with the section runs).

``--check``: the matrix-free rows against the dense path (``jacobian={"dense": True}``, every
eigenvalue by LAPACK): the exact columns (top-k eigenvalue statistics, top |lambda|,
self-alignment) to rel 1e-6, the Hutchinson estimates within 4 standard errors.

    python benchmarks/host_bound.py [--quick] [--check] [--device cpu] [--out FILE]
    python benchmarks/host_bound.py --table FILE     # the markdown table of a JSONL file

``--quick``: the d=128 proxy only. ``--device cuda``: the same on a GPU (syncs then include the
profiler's device-to-host copies).
``--rule on|off|both``: the CPU cost rule (``linalg.cost``: on the CPU from d =
``CPU_FLOP_BOUND_N`` one layer at a time and single-vector svds) as it is, off (layer groups and
block svds at every width, the code before the rule), or both arms, their timed rounds
interleaved (a row per arm, ``cost_rule``). The d=128 proxy is below the crossover: both arms run
the same code there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import torch  # noqa: E402
from jsonl import append_jsonl  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

#: name -> (d, heads, kv heads, MLP width, layers, tokens)
PROXIES = {"d128x8": (128, 4, 1, 448, 8, 64), "d1024x4": (1024, 8, 2, 3584, 4, 64)}
K = 16
EXACT_COLUMNS = ("top_eig_abs", f"frac_complex_top{K}", f"mean_abs_angle_top{K}",
                 f"frac_negative_top{K}", f"self_alignment_top{K}")
ESTIMATED_COLUMNS = ("sym_energy", "commutator")


def build(name: str, device: str):
    """The proxy model at random init (seeded), instrumented, one recorded forward."""
    from transformers import LlamaConfig, LlamaModel

    import spectral_hooks as sh

    d, heads, kv, ffn, layers, tokens = PROXIES[name]
    cfg = LlamaConfig(hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=d // heads,
                      vocab_size=1000, max_position_embeddings=4096, rope_theta=500000.0,
                      rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaModel(cfg).eval().to(device)
    ids = torch.randint(0, 1000, (1, tokens), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=ids)
    return model, probe, ids


class Applications:
    """Counts sequential operator applications and puts each in ``record_function("operator")``
    (patches the JVP/VJP entry points of ``spectral_hooks.linearize``; ``restore()`` undoes)."""

    def __init__(self) -> None:
        from spectral_hooks.linearize import engine
        self.calls = 0
        self._patched: list = []
        classes = [(getattr(engine, "Engine", None) or getattr(engine, "_Engine"),
                    ("jvp", "vjp"))]
        try:  # the layer groups of issue 37 (absent before)
            from spectral_hooks.linearize import group
            classes.append((group.BlockGroup, ("_apply", "apply_one")))
        except ImportError:
            pass
        for cls, names in classes:
            for name in names:
                if hasattr(cls, name):
                    self._patch(cls, name)

    def _patch(self, cls, name: str) -> None:
        f = getattr(cls, name)
        counter = self

        def wrapped(obj, *args, **kwargs):
            counter.calls += 1
            with record_function("operator"):
                return f(obj, *args, **kwargs)
        setattr(cls, name, wrapped)
        self._patched.append((cls, name, f))

    def restore(self) -> None:
        for cls, name, f in self._patched:
            setattr(cls, name, f)


def _inside(e, names) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.name in names:
            return True
        p = p.cpu_parent
    return False


#: Host-side work on host copies (its reads touch no device): LAPACK's workspace queries
#: inside a CPU eig/svd of a projected problem, and the library's marked host blocks.
HOST_RANGES = ("aten::linalg_eig", "aten::linalg_eigvals", "aten::_linalg_svd",
               "aten::linalg_svd", "spectral_hooks.host")
#: Tensor methods that read values into Python without an ``aten::_local_scalar_dense`` on
#: the CPU (on an accelerator each is a device-to-host copy: a sync).
READS = ("tolist", "numpy", "cpu")


class Reads:
    """Counts calls of :data:`READS` while active (an upper bound: a read of a tensor that is
    already on the host counts too)."""

    def __init__(self) -> None:
        self.n, self.saved = 0, {}

    def __enter__(self) -> "Reads":
        for name in READS:
            f = getattr(torch.Tensor, name)
            self.saved[name] = f

            def g(t, *a, _f=f, **kw):
                self.n += 1
                return _f(t, *a, **kw)
            setattr(torch.Tensor, name, g)
        return self

    def __exit__(self, *exc) -> None:
        for name, f in self.saved.items():
            setattr(torch.Tensor, name, f)


def counts(events, reads: int = 0) -> dict:
    """Ops and host syncs of a profiled section run (see the module doc)."""
    top = [e for e in events if e.cpu_parent is None and e.name.startswith("aten::")]
    operator_top = [e for e in events if e.name.startswith("aten::") and e.cpu_parent is not None
                    and e.cpu_parent.name == "operator"]
    scalar = [e for e in events if e.name in ("aten::_local_scalar_dense", "aten::nonzero")]
    host = [e for e in scalar if _inside(e, HOST_RANGES)]
    device = [e for e in scalar if not _inside(e, HOST_RANGES)]
    return dict(solver_ops=len(top), total_ops=len(top) + len(operator_top),
                syncs=len(device) + reads, scalar_reads=len(device), value_reads=reads,
                operator_syncs=sum(_inside(e, ("operator",)) for e in device),
                host_eig_reads=len(host))


def profiled(probe, device: str) -> tuple:
    """(counts, table, sequential applications) of one profiled section run."""
    app = Applications()
    try:
        activities = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if device.startswith("cuda") else [])
        with profile(activities=activities) as prof, Reads() as reads:
            table = section(probe)
        return counts(prof.events(), reads.n), table, app.calls
    finally:
        app.restore()


def clear_traces() -> None:
    """Forget the traced JVP graphs (``linearize.shared``'s per-process cache)."""
    from spectral_hooks.linearize import shared
    if hasattr(shared, "clear_traces"):
        shared.clear_traces()
    else:  # the code before issue 37 (the "before" measurement)
        shared._TRACES.clear()
    try:
        from spectral_hooks.linearize import group
    except ImportError:
        return
    group.clear_group_graphs()


def section(probe, dense: bool = False):
    return probe.analyze(power=False, progress=False,
                         jacobian={"k": K, "dense": dense}).jacobian


def forward_seconds(model, ids, device: str, n: int = 20) -> float:
    times = []
    with torch.no_grad():
        model(input_ids=ids)
        for _ in range(n):
            sync(device)
            t = time.perf_counter()
            model(input_ids=ids)
            sync(device)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_section(name: str, device: str) -> tuple:
    """(seconds, table) of the section from a fresh probe (its own cache)."""
    model, probe, _ = build(name, device)
    sync(device)
    t = time.perf_counter()
    table = section(probe)
    sync(device)
    seconds = time.perf_counter() - t
    probe.remove()
    return seconds, table


#: ``cost.CPU_FLOP_BOUND_N`` in the ``--rule off`` arm: above every width, so the section takes
#: the dispatch-bound shape (layer groups, block svds) at every d, as before the rule
RULE_OFF = 10 ** 9


@contextlib.contextmanager
def cost_rule(arm: str):
    """Run with the CPU cost rule (``linalg.cost``) as it is ("on") or turned off ("off"); code
    without the rule (before issue 37's cost rule) runs as it is in either arm."""
    try:
        from spectral_hooks.linalg import cost
    except ImportError:
        print(f"cost rule arm {arm!r}: this code has no linalg.cost (it predates the rule); "
              "running it as it is", file=sys.stderr)
        yield
        return
    saved = cost.CPU_FLOP_BOUND_N
    cost.CPU_FLOP_BOUND_N = saved if arm == "on" else RULE_OFF
    try:
        yield
    finally:
        cost.CPU_FLOP_BOUND_N = saved


def measure(name: str, device: str, rounds: int, check: bool,
            arms: tuple[str, ...] = ("on",)) -> list[dict]:
    """One row per cost-rule arm; the timed rounds interleave the arms (alternating order)."""
    d, heads, kv, ffn, layers, tokens = PROXIES[name]
    cold = {}
    for arm in arms:
        clear_traces()
        with cost_rule(arm):
            cold[arm], _ = timed_section(name, device)  # traces the JVP graphs
    model, probe, ids = build(name, device)
    fwd, sec = [], {arm: [] for arm in arms}
    for r in range(rounds):  # interleaved: a forward, then a section per arm from a fresh probe
        fwd.append(forward_seconds(model, ids, device))
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            with cost_rule(arm):
                sec[arm].append(timed_section(name, device)[0])
    fwd.append(forward_seconds(model, ids, device))
    forward = statistics.median(fwd)
    probe.remove()
    rows = []
    for arm in arms:
        seconds = statistics.median(sec[arm])
        ratios = [s / f for s, f in zip(sec[arm], fwd)]
        with cost_rule(arm):
            probe = build(name, device)[1]
            c, table, calls = profiled(probe, device)
            clear_traces()  # a new process: the traced graphs are built again, inside the count
            cold_probe = build(name, device)[1]
            cold_counts, _, cold_calls = profiled(cold_probe, device)
            cold_probe.remove()
            row = dict(what="jacobian section, matrix-free, k=16", proxy=name, d=d, heads=heads,
                       kv_heads=kv, ffn=ffn, layers=layers, tokens=tokens, device=device,
                       cost_rule=arm, applications=calls / layers,
                       **{key: value / layers for key, value in c.items()},
                       cold_applications=cold_calls / layers,
                       **{f"cold_{key}": value / layers for key, value in cold_counts.items()},
                       n_matvecs=float(table["n_matvecs"].sum()) / layers,
                       seconds=seconds / layers, cold_seconds=cold[arm] / layers,
                       seconds_all=[s / layers for s in sec[arm]],
                       forward_s=forward, forward_equivalents=seconds / layers / forward,
                       forward_equivalents_min_max=[min(ratios) / layers, max(ratios) / layers],
                       converged=bool(table["converged"].all()), rounds=rounds)
            if check:
                row.update(check_dense(probe, table))
        probe.remove()
        row.update(torch=torch.__version__, threads=torch.get_num_threads(),
                   load_avg_1min=round(os.getloadavg()[0], 2),
                   date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        rows.append(row)
    return rows


def check_dense(probe, table) -> dict:
    """Largest relative gap of the exact columns, largest |gap| / se of the estimated ones,
    matrix-free against the dense path (computed after the timed runs)."""
    dense = section(probe, dense=True)
    exact = 0.0
    for col in EXACT_COLUMNS:
        a = torch.tensor(table[col].to_numpy(dtype=float))
        b = torch.tensor(dense[col].to_numpy(dtype=float))
        exact = max(exact, float(((a - b).abs() / b.abs().clamp_min(1e-12)).max()))
    z = 0.0
    for col in ESTIMATED_COLUMNS:
        a = torch.tensor(table[col].to_numpy(dtype=float))
        b = torch.tensor(dense[col].to_numpy(dtype=float))
        se = torch.tensor(table[f"{col}_se"].to_numpy(dtype=float))
        z = max(z, float(((a - b).abs() / se.clamp_min(1e-300)).max()))
    return dict(check_exact_max_rel=exact, check_estimates_max_z=z,
                check_ok=bool(exact <= 1e-6 and z <= 4.0))


def markdown(path: str) -> str:
    rows = [json.loads(line) for line in open(path)]
    out = ["| proxy | device | applications | solver ops | total ops (cold) | host syncs (cold) "
           "(+ host eig reads) | s (cold s) | forward-equivalents (min-max) | dense check | "
           "date |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r["forward_equivalents_min_max"]
        check = "-" if "check_ok" not in r else (
            f"{'ok' if r['check_ok'] else 'FAIL'}: rel {r['check_exact_max_rel']:.0e}, "
            f"{r['check_estimates_max_z']:.1f} se")
        rule = f", rule {r['cost_rule']}" if "cost_rule" in r else ""
        out.append(f"| {r['proxy']} ({r['layers']} layers){rule} | {r['device']} | "
                   f"{r['applications']:.0f} | {r['solver_ops']:,.0f} | {r['total_ops']:,.0f} "
                   f"({r['cold_total_ops']:,.0f}) | {r['syncs']:.0f} ({r['cold_syncs']:.0f}) "
                   f"(+{r['host_eig_reads']:.0f}) | {r['seconds']:.3f} "
                   f"({r['cold_seconds']:.3f}) | {r['forward_equivalents']:.1f} ({lo:.1f}-{hi:.1f}) "
                   f"| {check} | {r['date']} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the d=128 proxy only")
    ap.add_argument("--check", action="store_true", help="compare with the dense path")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--proxies", nargs="+", default=None, choices=sorted(PROXIES))
    ap.add_argument("--rule", choices=("on", "off", "both"), default="on",
                    help="the CPU cost rule (linalg.cost): as it is, off (layer groups and block "
                         "svds at every width), or both arms interleaved in one window")
    ap.add_argument("--out", default=None, help="append the JSON lines to this file")
    ap.add_argument("--table", default=None, help="print the markdown table of a JSONL file")
    args = ap.parse_args()
    if args.table:
        print(markdown(args.table))
        return
    torch.set_num_threads(1)
    names = args.proxies or (["d128x8"] if args.quick else list(PROXIES))
    for name in names:
        arms = ("on", "off") if args.rule == "both" else (args.rule,)
        for row in measure(name, args.device, args.rounds, args.check, arms):
            print(json.dumps(row), flush=True)
            append_jsonl(args.out, [row])


if __name__ == "__main__":
    main()
