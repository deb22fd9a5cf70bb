"""Recording cost, base commit against this tree, in ONE process: plain, base probe and this
tree's probe rotated every round, so that both probes meet the same machine state.

    git worktree add /tmp/base <commit>
    python benchmarks/recording_ab.py --base /tmp/base                      # the CPU proxy
    python benchmarks/recording_ab.py --base /tmp/base --capture power --rounds 60
    python benchmarks/recording_ab.py --base /tmp/base --model minilm --calls 10
    python benchmarks/recording_ab.py                                      # this tree and the floor

Every run also times the **floor**: no-op hooks and taps of the same kinds (pre / post, with or
without keyword arguments) on the same modules as this tree's probe attaches in its steady
state, each keeping a reference to the tensor it sees, as ours do. What the floor costs is the
mechanism's: a module with a hook leaves ``Module.__call__``'s fast path, a tap adds one call,
and the allocator cannot reuse what they hold. What this tree's probe costs above it is our
Python. ``--floor-hooks`` times the same points as plain hooks (what a probe built only on
hooks could not go below).

Why: on a shared machine the speed of a core drifts by tens of percent within minutes, more
than the 1-2% a change to the hooks moves (``recording_cost.py`` alternates the arms within a
process, but before and after then run minutes apart). Here the base tree's package is copied
under another name (``spectral_hooks_base``, its imports renamed) and imported beside this
tree's; one model, one probe of each, each attached only for its own arm (``attach()`` /
``remove()``, their first calls made before timing). Each round times ``--calls`` forwards per
arm (this thread's CPU time, ``torch.no_grad()``, the recording cleared after each forward) in
an order that rotates through the permutations of the arms. We quote, per probe, the median over rounds
of its time / the plain arm's, the 25th and 75th percentiles, and the CPU time added a forward.
The base needs ``Probe.attach`` (2026-12-05 on); without ``--base`` only this tree and the floor
are timed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recording_cost import build, count_hooks  # noqa: E402

from spectral_hooks.hooks.taps import ForwardTap, taps_on  # noqa: E402


def import_base(base: str):
    """The package of the checkout at ``base``, imported as ``spectral_hooks_base``."""
    target = os.path.join(tempfile.mkdtemp(prefix="recording_ab_"), "spectral_hooks_base")
    shutil.copytree(os.path.join(base, "spectral_hooks"), target)
    for root, _, files in os.walk(target):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(re.sub(r"\bspectral_hooks\b", "spectral_hooks_base", text))
    sys.path.insert(0, os.path.dirname(target))
    import spectral_hooks_base

    return spectral_hooks_base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="a checkout of the base commit (optional)")
    parser.add_argument("--model", default="proxy", choices=["proxy", "minilm"])
    parser.add_argument("--capture", default="default",
                        help="'default' (instrument()'s), 'power' (the training callbacks') "
                             "or comma-separated points")
    parser.add_argument("--rounds", type=int, default=36)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--floor-hooks", action="store_true",
                        help="also time the floor's points as plain forward hooks")
    args = parser.parse_args()

    import spectral_hooks as ours

    base = import_base(args.base) if args.base else None
    torch.set_num_threads(1)
    model, inputs = build(args.model)
    capture = {"default": None, "power": ("resid_pre", "resid_post")}.get(
        args.capture, tuple(args.capture.split(",")))
    plain_hooks = count_hooks(model)
    hooks_before = {m: (set(m._forward_hooks), set(m._forward_pre_hooks)) for m in model.modules()}
    probes: dict = {}
    floor = hook_floor = None
    with torch.no_grad():
        reference = model(**inputs)[0]
        for name, package in (("base", base), ("this tree", ours)):
            if package is None:
                continue
            probe = package.instrument(model, capture=capture) if capture else \
                package.instrument(model)
            for _ in range(2):  # the first call copies and checks: not what is timed
                out = model(**inputs)[0]
            assert torch.equal(out, reference), f"{name}: outputs differ"
            print(f"{name}: {count_hooks(model) - plain_hooks} hooks", flush=True)
            if package is ours:
                floor = Floor(model, hooks_before)
                if args.floor_hooks:
                    hook_floor = Floor(model, hooks_before, hooks_only=True)
            probe.remove()
            probe.clear()
            probes[name] = probe
    assert count_hooks(model) == plain_hooks, "a probe left hooks behind"

    assert floor is not None
    probes["floor"] = floor
    if hook_floor is not None:
        probes["floor, hooks"] = hook_floor

    def arm(name: str) -> float:
        probe = probes.get(name)
        if probe is not None:
            probe.attach()
        start = time.thread_time()
        for _ in range(args.calls):
            model(**inputs)
            if probe is not None:
                probe.clear()
        spent = (time.thread_time() - start) / args.calls
        if probe is not None:
            probe.remove()
        return spent

    names = ["plain"] + [name for name in ("base", "this tree", "floor", "floor, hooks")
                         if name in probes]
    orders = list(itertools.permutations(names))
    times: dict = {name: [] for name in names}
    with torch.no_grad():
        for name in names:
            arm(name)  # warm-up
        for r in range(args.rounds):
            for name in orders[r % len(orders)]:
                times[name].append(arm(name))
    plain = times["plain"]
    print(f"{args.model}, capture {args.capture}, {args.rounds} rounds of {args.calls} calls, "
          f"plain forward {1e3 * statistics.median(plain):.2f} ms (CPU, 1 thread), load "
          f"{[round(x, 2) for x in os.getloadavg()]}")
    for name in names[1:]:
        ratios = [t / p for t, p in zip(times[name], plain)]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        added = statistics.median([(t - p) * 1e6 for t, p in zip(times[name], plain)])
        print(f"  {name}: recorded / plain {statistics.median(ratios):.4f} "
              f"(p25 {q1:.4f}, p75 {q3:.4f}), {added:.0f} us added a forward")
    if "base" in times:
        # the two probes of a round meet the same machine state: their difference is the
        # sharpest figure (standard error of a median ~ 1.25 sigma / sqrt(n), sigma ~ IQR / 1.35)
        diffs = [(t - b) * 1e6 for t, b in zip(times["this tree"], times["base"])]
        q1, _, q3 = statistics.quantiles(diffs, n=4)
        se = 1.25 * (q3 - q1) / 1.35 / len(diffs) ** 0.5
        print(f"  this tree - base, per round: median {statistics.median(diffs):+.0f} us a "
              f"forward (standard error ~{se:.0f} us)")


class Floor:
    """No-op hooks mirroring the ones a probe holds on ``model`` now (those not in ``before``,
    module -> (forward hook ids, forward pre-hook ids)): same modules, kinds and keyword
    flags; each keeps a reference to the tensor it sees. ``attach`` / ``remove`` / ``clear``
    as a probe's."""

    def __init__(self, model: torch.nn.Module, before: dict, *, hooks_only: bool = False) -> None:
        self.kept: list = []
        self.handles: list = []
        self.points = []  # (module, "pre" or "post", with_kwargs, as a tap)
        for module in model.modules():
            post, pre = before[module]
            self.points += [(module, "pre", i in module._forward_pre_hooks_with_kwargs, False)
                            for i in set(module._forward_pre_hooks) - pre]
            self.points += [(module, "post", i in module._forward_hooks_with_kwargs, False)
                            for i in set(module._forward_hooks) - post]
            self.points += [(module, "pre" if tap.pre is not None else "post", True,
                             not hooks_only) for tap in reversed(taps_on(module))]

    def attach(self) -> None:
        keep = self.kept.append
        for module, kind, with_kwargs, tap in self.points:
            if tap:
                self.handles.append(
                    ForwardTap(module, pre=lambda m, a, kw: keep(a[0] if a else kw)) if kind == "pre"
                    else ForwardTap(module, post=lambda m, a, kw, out: keep(out)))
            elif kind == "pre":
                hook = (lambda m, a, kw: keep(a[0] if a else kw)) if with_kwargs else \
                    (lambda m, a: keep(a[0] if a else None))
                self.handles.append(module.register_forward_pre_hook(hook, with_kwargs=with_kwargs))
            else:
                hook = (lambda m, a, kw, out: keep(out)) if with_kwargs else \
                    (lambda m, a, out: keep(out))
                self.handles.append(module.register_forward_hook(hook, with_kwargs=with_kwargs))

    def remove(self) -> None:
        for handle in reversed(self.handles):
            handle.remove()
        self.handles = []

    def clear(self) -> None:
        self.kept.clear()


if __name__ == "__main__":
    main()
