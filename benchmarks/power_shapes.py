"""The power view at real shapes on a CPU (issue 57): route costs on F's own eig, and default
``analyze()`` on GPT-2-medium, Qwen3-0.6B and Llama-3.2-1B shapes, quiet and with the cores busy.

    python benchmarks/power_shapes.py --calibrate   # route costs per layer (sets MATRIX_FREE_D,
                                                    # FACTORED_EXACT_MAX), ~3 min
    python benchmarks/power_shapes.py --shapes      # default analyze() per shape, ~5 min
    python benchmarks/power_shapes.py --busy        # GPT-2-medium (8 of its layers), torch's
                                                    # default threads, both cores busy, against
                                                    # quiet one thread, ~4 min

Everything runs on random-init weights built offline. ``--calibrate`` times, per layer matrix F
(interleaved rounds, one thread, median and range), each way the power view can get its spectrum:

* ``eig``: the dense float64 eig with every eigenvector (the route before issue 57);
* ``values-first``: every eigenvalue from LAPACK without eigenvectors, the leading eigenvectors
  by inverse iteration (``metrics.spectrum``, the dense route now);
* ``krylov F``: the top 8 by ``linalg.eigs`` on the formed F (a DenseOperator);
* ``krylov B A``: the top 8 by ``linalg.eigs`` on the r x r B A of the thin factors (vectors
  A y; r = d: on the factors x -> A (B x));
* for grouped-query factors (r < d) ``factored``: every eigenvalue from the r x r B A,
  values-first.

F = sum_h W_O^h W_V^h of Gaussian heads (HF's init, std 0.02): its top is a crowd of complex
pairs, the hard case for Krylov. After the timed rounds, every route's leading values are checked
against the dense oracle (``torch.linalg.eigvals``, run last).

``--shapes`` builds each model at its real attention shape and depth (vocabulary 1000 and MLP
width 256: the power view reads only W_O and W_V, and the forward is not timed), records one
batch of 2 x 64 tokens, and times ``probe.analyze()`` with the defaults (its ``power`` and
``spectra`` tables) from cleared caches, against the route before issue 57 in the same run
("before": ``MATRIX_FREE_D = 2048``, the full eig, torch's thread count; ``--skip-before``
leaves it out) and, for a grouped-query shape, every eigenvalue exactly from B A ("exact":
``FACTORED_EXACT_MAX = 2048``, as before this change), interleaved. The default's power
columns are checked against the full eig's after the timed rounds. For the issue's budgets,
quietly: ``python benchmarks/power_shapes.py --shapes --rounds 3 --skip-before``.

``--busy`` times GPT-2-medium's default ``analyze()`` at torch's default thread count while two
other processes spin on the two cores, against the quiet one-thread time, interleaved (the
spinners are started and stopped each round), and the "before" route the same way. At torch's
default count the layers' spectra run that many at a time, each on one CPU thread
(``metrics.spectrum.spectrum_workers``); "busy 1 thread" is one layer at a time.
Results are appended to benchmarks/results/power_shapes.md with ``uptime``'s load.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

RESULTS = Path(__file__).parent / "results" / "power_shapes.md"
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {  # attention shapes, depths of the releases
    "GPT-2-medium": ("gpt2", dict(n_embd=1024, n_layer=24, n_head=16)),
    "Qwen3-0.6B": ("qwen3", dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                                 num_key_value_heads=8, head_dim=128)),
    "Llama-3.2-1B": ("llama", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=64)),
}


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def write(lines: list[str]) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as f:
        f.write("\n".join(lines) + "\n\n")
    print("\n".join(lines), flush=True)


def interleaved(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each variant per round, A B C A B C ..., after one warm-up each (but those
    named "before": the slow route before issue 57 warms up in the first round's "now")."""
    for name, fn in variants.items():
        if name != "before":
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def summary(ts: list[float]) -> str:
    return f"{statistics.median(ts):.3f} s ({min(ts):.3f}-{max(ts):.3f})"


def ratio(a: list[float], b: list[float]) -> str:
    rs = [x / y for x, y in zip(a, b)]
    return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})"


# ----------------------------------------------------------------------------- calibration


def gaussian_factors(d: int, heads: int, d_head: int, kv: int, seed: int):
    """A [d, r], B [r, d] of a random-init layer (std 0.02; heads sharing a W_V merged)."""
    g = torch.Generator().manual_seed(seed)
    W_O = 0.02 * torch.randn(heads, d, d_head, dtype=torch.float64, generator=g)
    W_V = 0.02 * torch.randn(kv, d_head, d, dtype=torch.float64, generator=g)
    group = heads // kv
    A = torch.cat([W_O[i * group:(i + 1) * group].sum(0) for i in range(kv)], dim=1)
    B = W_V.reshape(kv * d_head, d)
    return A, B


def calibrate(rounds: int, widths: list[int] | None) -> None:
    from spectral_hooks.linalg import LowRankOperator
    from spectral_hooks.linalg.operators import DenseOperator
    from spectral_hooks.metrics import spectrum as S

    torch.set_num_threads(1)
    lines = [f"## calibrate: route costs per layer, one thread ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)",
             f"load before: {load()}", "",
             "| d | r | route | seconds / layer | vs krylov F | top-8 max error / abs(lambda1) |",
             "|---|---|---|---|---|---|"]
    cases = [(512, 8, 64, 8), (768, 12, 64, 12), (1024, 16, 64, 16), (1536, 12, 128, 12),
             (2048, 16, 64, 2), (2048, 32, 64, 4), (2048, 24, 64, 6),  # r = 128, 256, 384
             (2048, 32, 64, 8), (2048, 16, 128, 8), (4096, 32, 128, 8), (3584, 16, 256, 8)]
    for d, heads, d_head, kv in cases:
        if widths and d not in widths:
            continue
        A, B = gaussian_factors(d, heads, d_head, kv, seed=d + kv)
        r = B.shape[0]
        F = A @ B
        op, dense_op = LowRankOperator(A, B), DenseOperator(F)
        out: dict[str, object] = {}

        def run(name: str, fn: Callable[[], object]) -> Callable[[], object]:
            def go() -> object:
                out[name] = fn()
                return out[name]
            return go
        variants = {
            "krylov F": run("krylov F", lambda: S.layer_spectrum(dense_op, "F", 1e-9, 0, 8, vectors=False)),
            "krylov B A": run("krylov B A", lambda: S.layer_spectrum(op, "F", 1e-9, 0, 8, vectors=False,
                                                                     factored_max=0)),
        }
        if r < d:
            variants["factored"] = run("factored", lambda: S.layer_spectrum(op, "F", 1e-9, d, 8, vectors=False,
                                                                            factored_max=d))
        if d <= 1536:  # the GQA shapes above take the factored route
            variants["values-first"] = run("values-first", lambda: S.layer_spectrum(F, "F", 1e-9, d, 8,
                                                                                    vectors=False))
            variants["eig"] = run("eig", lambda: S.layer_spectrum(F, "F", 1e-9, d, 8, vectors=True))
        times = interleaved(variants, rounds if d <= 2048 else 1)
        oracle = torch.linalg.eigvals(F)  # after the timed rounds
        top = oracle[oracle.abs().argsort(descending=True)][:8].abs()
        for name, ts in times.items():
            s = out[name]
            got = s.eigenvalues[:8].abs()  # type: ignore[attr-defined]
            err = float((got - top[:got.numel()]).abs().max() / top[0])
            lines.append(f"| {d} | {r} | {name} | {summary(ts)} | {ratio(ts, times['krylov F'])} | {err:.1e} |")
        print("\n".join(lines[-len(times):]), flush=True)
    lines.append(f"\nload after: {load()}")
    write(lines)


# ----------------------------------------------------------------------------- shapes


def build(shape: str, n_layers: int | None = None):
    import spectral_hooks as sh
    family, kw = SHAPES[shape]
    if n_layers:  # the same layers, fewer of them
        kw = {**kw, ("n_layer" if family == "gpt2" else "num_hidden_layers"): n_layers}
    torch.manual_seed(0)
    if family == "gpt2":
        from transformers import GPT2Config, GPT2Model
        model = GPT2Model(GPT2Config(**kw, n_inner=256, vocab_size=1000, n_positions=128))
    elif family == "qwen3":
        from transformers import Qwen3Config, Qwen3Model
        model = Qwen3Model(Qwen3Config(**kw, intermediate_size=256, vocab_size=1000))
    else:
        from transformers import LlamaConfig, LlamaModel
        model = LlamaModel(LlamaConfig(**kw, intermediate_size=256, vocab_size=1000,
                                       bos_token_id=0, eos_token_id=0))
    model.eval()
    probe = sh.instrument(model)
    ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=ids)
    return probe


@contextlib.contextmanager
def patched(module, **values):
    """``module``'s attributes set to ``values`` inside, restored after."""
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


@contextlib.contextmanager
def before_issue_57():
    """The route before issue 57: dense full eig below d = 2048 with every eigenvector, at
    torch's thread count (the factored route as it was: its full eig of B A, up to r = 2048)."""
    from spectral_hooks.linalg import sorted_eig as SE
    from spectral_hooks.metrics import spectrum as S
    with patched(S, MATRIX_FREE_D=2048, FACTORED_EXACT_MAX=2048, POWER_THREADS=1 << 20,
                 eig_leading=SE.sorted_eig), patched(SE, _factored_leading=lambda *a: None):
        yield


@contextlib.contextmanager
def exact_factored():
    """Today's default but every eigenvalue of a grouped-query F exactly from its r x r B A up
    to r = 2048 (``FACTORED_EXACT_MAX`` as it was), not the top k by Krylov on B A."""
    from spectral_hooks.metrics import spectrum as S
    with patched(S, FACTORED_EXACT_MAX=2048):
        yield


def analyze_once(probe, before: bool = False, route: Callable[[], Any] | None = None):
    from spectral_hooks.metrics.spectrum import clear_spectrum_cache
    clear_spectrum_cache()
    probe.invalidate()
    with before_issue_57() if before else route() if route else contextlib.nullcontext():
        report = probe.analyze(progress=False)
        return report.power, report.spectra


def check(probe, power) -> str:
    """The default's power columns against the full eig's (power={"full": True}, values-first
    with its residual checks), after the timed rounds."""
    import numpy as np

    from spectral_hooks.metrics.spectrum import clear_spectrum_cache
    clear_spectrum_cache()
    probe.invalidate()
    with before_issue_57():
        full = probe.analyze(power={"full": True}, progress=False).power
    cols = ["abs_lambda1", "abs_lambda2", "gap_ratio", "gamma_in", "gamma", "gamma2", "rho",
            "subspace_cos_ref"]
    a, b = power[cols].to_numpy(float), full[cols].to_numpy(float)
    return f"max |default - full eig| over {cols}: {np.nanmax(np.abs(a - b)):.1e}"


def thin(name: str) -> bool:
    """Whether the shape's F = W_O W_V has inner width r = kv heads x d_head below d."""
    family, kw = SHAPES[name]
    if family == "gpt2":
        return False
    return kw["num_key_value_heads"] * kw["head_dim"] < kw["hidden_size"]


def routes_of(power) -> str:
    return (f"truncated {int(power['truncated'].sum())}/{len(power)}, "
            f"n_computed {sorted(set(power['n_computed']))}")


def shapes(rounds: int, names: list[str], with_before: bool) -> None:
    """Default analyze() per shape, one thread, against the route before issue 57 and, for a
    grouped-query shape, every eigenvalue exactly from B A (``exact_factored``), interleaved."""
    torch.set_num_threads(1)
    lines = [f"## default analyze() per shape, one thread ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)",
             f"load before: {load()}", "",
             "| shape | default now | exact from B A (r <= 2048) | before (full eig, d < 2048 dense) "
             "| before / now | routes now | check |",
             "|---|---|---|---|---|---|---|"]
    for name in names:
        probe = build(name)
        out: dict[str, Any] = {}
        variants: dict[str, Callable[[], object]] = {
            "now": lambda: out.__setitem__("now", analyze_once(probe))}
        if thin(name):  # grouped-query with r < d: the factored routes differ
            variants["exact"] = lambda: out.__setitem__("exact", analyze_once(probe, route=exact_factored))
        if with_before:
            variants["before"] = lambda: analyze_once(probe, before=True)
        times = interleaved(variants, rounds)
        power = out["now"][0]
        exact = "-"
        if "exact" in times:
            exact = f"{summary(times['exact'])}, {routes_of(out['exact'][0])}"
        before = (f"{summary(times['before'])} | {ratio(times['before'], times['now'])}"
                  if with_before else "- | -")
        lines.append(f"| {name} | {summary(times['now'])} | {exact} | {before} | "
                     f"{routes_of(power)} | {check(probe, power)} |")
        print(lines[-1], flush=True)
        probe.remove()
    lines.append(f"\nload after: {load()}")
    write(lines)


def spinners(n: int) -> list[subprocess.Popen]:
    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"  # dies with us
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]


def busy(rounds: int, n_layers: int, with_before: bool) -> None:
    default_threads = torch.get_num_threads()
    probe = build("GPT-2-medium", n_layers)
    lines = [f"## GPT-2-medium ({n_layers} layers) default analyze(): busy cores at torch's default threads "
             f"({default_threads}) vs quiet one thread ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)",
             f"load before: {load()}", ""]
    times: dict[str, list[float]] = {k: [] for k in ("quiet 1 thread", "busy default threads",
                                                      "busy 1 thread",
                                                      "before: quiet 1 thread",
                                                      "before: busy default threads")}
    analyze_once(probe)  # warm-up
    for _ in range(rounds):
        for before in (False, True) if with_before else (False,):
            tag = "before: " if before else ""
            torch.set_num_threads(1)
            t0 = time.perf_counter()
            analyze_once(probe, before)
            times[tag + "quiet 1 thread"].append(time.perf_counter() - t0)
            print(tag + "quiet 1 thread", times[tag + "quiet 1 thread"][-1], flush=True)
            procs = spinners(2)
            time.sleep(0.5)
            try:
                for threads, name in ((default_threads, "busy default threads"),
                                      (1, "busy 1 thread")):
                    if before and threads == 1:
                        continue
                    torch.set_num_threads(threads)
                    t0 = time.perf_counter()
                    analyze_once(probe, before)
                    times[tag + name].append(time.perf_counter() - t0)
                    print(tag + name, times[tag + name][-1], flush=True)
                lines.append(f"(load with spinners: {load()})")
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
    for name, ts in times.items():
        if ts:
            lines.append(f"- {name}: {summary(ts)}")
    lines.append(f"- now: busy / quiet = {ratio(times['busy default threads'], times['quiet 1 thread'])}")
    lines.append(f"- now: busy default threads / busy 1 thread = "
                 f"{ratio(times['busy default threads'], times['busy 1 thread'])}")
    if with_before:
        before = ratio(times["before: busy default threads"], times["before: quiet 1 thread"])
        lines.append(f"- before: busy / quiet = {before}")
    lines.append(f"\nload after: {load()}")
    write(lines)
    probe.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--shapes", action="store_true")
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--only", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--widths", nargs="*", type=int, help="--calibrate only these d")
    parser.add_argument("--busy-layers", type=int, default=8, help="--busy: GPT-2-medium layers")
    parser.add_argument("--skip-before", action="store_true",
                        help="--shapes: not the route before issue 57 (its rounds take ~30 s a shape)")
    parser.add_argument("--busy-before", action="store_true",
                        help="--busy: also the route before issue 57 (its busy rounds take minutes)")
    args = parser.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.calibrate:
        calibrate(args.rounds, args.widths)
    if args.shapes:
        shapes(args.rounds, args.only, not args.skip_before)
    if args.busy:
        busy(args.rounds, args.busy_layers, args.busy_before)


if __name__ == "__main__":
    main()
