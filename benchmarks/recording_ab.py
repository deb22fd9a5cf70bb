"""Recording cost, base commit against this tree, in ONE process: plain, base probe and this
tree's probe rotated every round, so that both probes meet the same machine state.

    git worktree add /tmp/base <commit>
    python benchmarks/recording_ab.py --base /tmp/base                      # the CPU proxy
    python benchmarks/recording_ab.py --base /tmp/base --capture power --rounds 60
    python benchmarks/recording_ab.py --base /tmp/base --model minilm --calls 10

Why: on a shared machine the speed of a core drifts by tens of percent within minutes, more
than the 1-2% a change to the hooks moves (``recording_cost.py`` alternates the arms within a
process, but before and after then run minutes apart). Here the base tree's package is copied
under another name (``spectral_hooks_base``, its imports renamed) and imported beside this
tree's; one model, one probe of each, each attached only for its own arm (``attach()`` /
``remove()``, their first calls made before timing). Each round times ``--calls`` forwards per
arm (this thread's CPU time, ``torch.no_grad()``, the recording cleared after each forward) in
an order that rotates through all six permutations. We quote, per probe, the median over rounds
of its time / the plain arm's, the 25th and 75th percentiles, and the CPU time added a forward.
The base needs ``Probe.attach`` (2026-12-05 on).
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
    parser.add_argument("--base", required=True, help="a checkout of the base commit")
    parser.add_argument("--model", default="proxy", choices=["proxy", "minilm"])
    parser.add_argument("--capture", default="default",
                        help="'default' (instrument()'s), 'power' (the training callbacks') "
                             "or comma-separated points")
    parser.add_argument("--rounds", type=int, default=36)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()

    import spectral_hooks as ours

    base = import_base(args.base)
    torch.set_num_threads(1)
    model, inputs = build(args.model)
    capture = {"default": None, "power": ("resid_pre", "resid_post")}.get(
        args.capture, tuple(args.capture.split(",")))
    plain_hooks = count_hooks(model)
    probes = {}
    with torch.no_grad():
        reference = model(**inputs)[0]
        for name, package in (("base", base), ("this tree", ours)):
            probe = package.instrument(model, capture=capture) if capture else \
                package.instrument(model)
            for _ in range(2):  # the first call copies and checks: not what is timed
                out = model(**inputs)[0]
            assert torch.equal(out, reference), f"{name}: outputs differ"
            print(f"{name}: {count_hooks(model) - plain_hooks} hooks", flush=True)
            probe.remove()
            probe.clear()
            probes[name] = probe
    assert count_hooks(model) == plain_hooks, "a probe left hooks behind"

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

    names = ["plain", "base", "this tree"]
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


if __name__ == "__main__":
    main()
