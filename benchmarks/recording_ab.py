"""Recording cost, base commit against this tree, in ONE process: plain, base probe and this
tree's probe rotated every round, so that both probes meet the same machine state.

    git worktree add /tmp/base <commit>
    python benchmarks/recording_ab.py --base /tmp/base                      # the CPU proxy
    python benchmarks/recording_ab.py --base /tmp/base --capture power --rounds 60
    python benchmarks/recording_ab.py --base /tmp/base --model minilm --calls 10
    python benchmarks/recording_ab.py                                      # this tree and the floor
    python benchmarks/recording_ab.py --pattern all --base /tmp/base       # the three patterns

Three patterns of use (``--pattern``; ``all`` runs them one after the other in one process):

- ``cleared`` (the default): one probe kept across forwards, the recording cleared after each
  one (a streaming user, a training callback's logged step);
- ``first``: a fresh probe for each forward, ``with instrument(model): model(...)`` (a notebook
  user). Two figures per probe: the forward alone (what the probe adds inside it; instrument()
  and remove() outside the timing), and the whole block (instrument(), the forward, remove()
  and dropping the probe), both against one plain forward. The probes of a round are not the
  first ever made on the model: what a probe learns about a model instance (that it writes no
  recorded state in place; that each block's input is the block output before it) is kept for
  the next probe on it (``hooks/forward_call.py`` ``model_facts``, weakly). The script also
  prints, once, the first probe ever made on the model, before any other;
- ``kept``: one probe kept across ``--calls`` forwards whose recording is kept (what
  ``analyze()`` over several batches needs), cleared after the last; the clear is timed with
  them. Calls recorded by reference are committed when the recording is first read: that read
  is timed apart (``commit at the first read``, per forward) and is not in the ratio.
  What a kept recording costs depends on the C allocator's state: glibc returns the freed
  top of its heap to the OS (its trim threshold starts at 128 KiB), so after each clear the
  next recording's pages are new memory again, each page a minor fault (2.6 us here on a quiet
  machine, more on a busy one: a VM's page faults are slow). Once the process has freed a
  large buffer (loading a checkpoint, an analysis: glibc raises its threshold to twice that
  buffer) the pages stay and are reused. ``kept`` times the heap as the process left it
  (cold, in this script: ``all`` runs it first, since the other patterns' forwards can warm
  it), ``kept-warm`` the same after freeing a 16 MiB buffer first (run last by ``all``: the
  allocator does not go back). The minor faults a forward say which state each arm met, and
  every arm that met new pages gets a second figure, ``without its page faults' cost``: its
  time less its faults at what a fault cost in that round (``page_fault_seconds``: fresh pages
  of an anonymous mapping, written once), which is what the same recording costs where pages
  are cheap or already held (a GPU's caching allocator, a warm heap).

Every run also times the **floor**: no-op hooks and taps of the same kinds (pre / post, with or
without keyword arguments) on the same modules as this tree's probe attaches in its steady
state, each keeping a reference to the tensor it sees, as ours do, in the same pattern (kept
across the forwards for ``kept``). What the floor costs is the mechanism's: a module with a
hook leaves ``Module.__call__``'s fast path, a tap adds one call, and the allocator cannot reuse
what they hold (where the recording is kept, its pages are new memory: the minor page faults a
forward are printed for every arm). What this tree's probe costs above it is our Python.
``--floor-hooks`` times the same points as plain hooks (what a probe built only on hooks could
not go below).

Why: on a shared machine the speed of a core drifts by tens of percent within minutes, more
than the 1-2% a change to the hooks moves (``recording_cost.py`` alternates the arms within a
process, but before and after then run minutes apart). Here the base tree's package is copied
under another name (``spectral_hooks_base``, its imports renamed) and imported beside this
tree's; one model, one probe of each, each attached only for its own arm (``attach()`` /
``remove()``, their first calls made before timing). Each round times ``--calls`` forwards per
arm (this thread's CPU time, ``torch.no_grad()``) in an order that rotates through the
permutations of the arms. We quote, per probe, the median over rounds of its time / the plain
arm's, the 25th and 75th percentiles, and the CPU time added a forward. The base needs
``Probe.attach`` (2026-12-05 on); without ``--base`` only this tree and the floor are timed.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import mmap
import os
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recording_cost import build, count_hooks  # noqa: E402

from spectral_hooks.hooks.taps import ForwardTap, taps_on  # noqa: E402

PATTERNS = ("kept", "cleared", "first", "kept-warm")  # the order of ``all``: see kept
WARM_HEAP_MIB = 16


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
    import spectral_hooks_base  # pyright: ignore[reportMissingImports]

    return spectral_hooks_base


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base", help="a checkout of the base commit (optional)")
    parser.add_argument("--model", default="proxy", choices=["proxy", "minilm"])
    parser.add_argument("--capture", default="default",
                        help="'default' (instrument()'s), 'power' (the training callbacks') "
                             "or comma-separated points")
    parser.add_argument("--pattern", default="cleared", choices=PATTERNS + ("all",))
    parser.add_argument("--rounds", type=int, default=36)
    parser.add_argument("--calls", type=int, default=20,
                        help="forwards per arm per round (kept: the forwards a recording keeps)")
    parser.add_argument("--floor-hooks", action="store_true",
                        help="also time the floor's points as plain forward hooks")
    args = parser.parse_args()

    import spectral_hooks as ours

    base = import_base(args.base) if args.base else None
    torch.set_num_threads(1)
    model, inputs = build(args.model)
    capture = {"default": None, "power": ("resid_pre", "resid_post")}.get(
        args.capture, tuple(args.capture.split(",")))
    packages = {"this tree": ours} if base is None else {"base": base, "this tree": ours}

    def instrument(package):
        return package.instrument(model, capture=capture) if capture else \
            package.instrument(model)

    plain_hooks = count_hooks(model)
    hooks_before = {m: (set(m._forward_hooks), set(m._forward_pre_hooks)) for m in model.modules()}
    probes: dict = {}
    floor = hook_floor = None
    with torch.no_grad():
        reference = model(**inputs)[0]
        first_ever(model, inputs, lambda: instrument(ours))
        for name, package in packages.items():
            probe = instrument(package)
            for _ in range(2):  # the first call copies and checks: not what is timed
                out = model(**inputs)[0]
            assert torch.equal(out, reference), f"{name}: outputs differ"
            # the package's own count: a base's taps are its own class
            points = package.hooks.taps.count_hook_points(model) - plain_hooks
            print(f"{name}: {points} hooks and taps", flush=True)
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

    for pattern in PATTERNS if args.pattern == "all" else (args.pattern,):
        if pattern == "kept-warm":
            warm_heap()
        arm = ARMS[pattern](model, inputs, probes, packages, instrument, args.calls)
        run(arm, ["plain"] + list(probes), args, pattern)
        gc.collect()
    assert count_hooks(model) == plain_hooks, "a probe left hooks behind"


def warm_heap() -> None:
    """Free a large buffer, as a process that loaded a checkpoint or ran an analysis has:
    glibc then keeps freed heap pages for reuse rather than returning them to the OS."""
    buffer = torch.empty(WARM_HEAP_MIB << 18)
    buffer.fill_(0.0)
    del buffer


def first_ever(model, inputs, instrument: Callable[[], Any]) -> None:
    """Time the first probe ever made on ``model`` (once: nothing learned about the model yet)
    beside a plain forward."""
    start = time.thread_time()
    model(**inputs)
    plain = time.thread_time() - start
    start = time.thread_time()
    probe = instrument()
    made = time.thread_time()
    model(**inputs)
    ran = time.thread_time()
    probe.remove()
    del probe
    print(f"the first probe ever on this model (one sample): instrument() {1e3 * (made - start):.2f} "
          f"ms, its first forward {1e3 * (ran - made):.2f} ms, a plain forward {1e3 * plain:.2f} ms",
          flush=True)


Arm = Callable[[str], dict]


def page_fault_seconds(pages: int = 256) -> float:
    """This thread's CPU seconds a minor page fault costs now: ``pages`` fresh pages of an
    anonymous mapping, each written once (what a kept tensor's new page costs the forward that
    allocates it)."""
    size = mmap.PAGESIZE
    with mmap.mmap(-1, pages * size) as memory:
        start = time.thread_time()
        for offset in range(0, pages * size, size):
            memory[offset] = 1
        return (time.thread_time() - start) / pages


def timed_forwards(model, inputs, calls, after_each=None) -> tuple[float, float]:
    """(this thread's CPU seconds, minor page faults) of ``calls`` forwards, ``after_each()``
    run after each one and timed with it."""
    faults, start = minor_faults(), time.thread_time()
    for _ in range(calls):
        model(**inputs)
        if after_each is not None:
            after_each()
    return time.thread_time() - start, minor_faults() - faults


def cleared_arm(model, inputs, probes, packages, instrument, calls) -> Arm:
    """One probe attached for the arm's forwards, its recording cleared after each."""
    def arm(name: str) -> dict:
        probe = probes.get(name)
        if probe is not None:
            probe.attach()
        spent, faults = timed_forwards(model, inputs, calls,
                                       probe.clear if probe is not None else None)
        if probe is not None:
            probe.remove()
        return {name: (spent / calls, faults / calls)}
    return arm


def kept_arm(model, inputs, probes, packages, instrument, calls) -> Arm:
    """One probe attached for the arm's forwards, the recording kept across them, then read
    once (the deferred commits: timed apart) and cleared (timed with the forwards)."""
    def arm(name: str) -> dict:
        probe = probes.get(name)
        if probe is not None:
            probe.attach()
        spent, faults = timed_forwards(model, inputs, calls)
        result = {}
        if probe is not None:
            probe.remove()
            recording = getattr(probe, "recording", None)
            if recording is not None:
                start = time.thread_time()
                assert recording.n_calls == calls  # the first read commits the deferred calls
                result[f"{name}: commit at the first read"] = (
                    (time.thread_time() - start) / calls, 0.0)
            start = time.thread_time()
            probe.clear()
            spent += time.thread_time() - start
        result[name] = (spent / calls, faults / calls)
        return result
    return arm


def first_arm(model, inputs, probes, packages, instrument, calls) -> Arm:
    """A fresh probe for each forward: instrument(), the forward, remove(), the probe dropped.
    Two figures: the forward alone, and the whole. The floor attaches its taps anew instead."""
    def arm(name: str) -> dict:
        if name == "plain" or name.startswith("floor"):
            floor = probes.get(name)
            forward = whole = 0.0
            faults = minor_faults()
            for _ in range(calls):
                start = time.thread_time()
                if floor is not None:
                    floor.attach()
                made = time.thread_time()
                model(**inputs)
                ran = time.thread_time()
                if floor is not None:
                    floor.remove()
                    floor.clear()
                end = time.thread_time()
                forward, whole = forward + ran - made, whole + end - start
            faults = (minor_faults() - faults) / calls
            if name == "plain":
                return {name: (forward / calls, faults)}
            return {name: (forward / calls, faults),
                    f"{name}, with attach and remove": (whole / calls, faults)}
        package = packages[name]
        forward = whole = 0.0
        faults = minor_faults()
        for _ in range(calls):
            start = time.thread_time()
            probe = instrument(package)
            made = time.thread_time()
            model(**inputs)
            ran = time.thread_time()
            probe.remove()
            del probe
            end = time.thread_time()
            forward, whole = forward + ran - made, whole + end - start
        faults = (minor_faults() - faults) / calls
        return {name: (forward / calls, faults),
                f"{name}, with instrument() and remove()": (whole / calls, faults)}
    return arm


ARMS = {"cleared": cleared_arm, "first": first_arm, "kept": kept_arm, "kept-warm": kept_arm}


def run(arm: Arm, names: list, args, pattern: str) -> None:
    """``--rounds`` rounds of every arm in rotating order; one line per figure."""
    orders = list(itertools.permutations(names))
    times: dict = {}
    fault_cost = []  # seconds a page fault, once a round
    with torch.no_grad():
        for name in names:
            arm(name)  # warm-up
        for r in range(args.rounds):
            for name in orders[r % len(orders)]:
                for label, value in arm(name).items():
                    times.setdefault(label, []).append(value)
            fault_cost.append(page_fault_seconds())
    plain = [t for t, _ in times["plain"]]
    print(f"{args.model}, capture {args.capture}, pattern {pattern}, {args.rounds} rounds of "
          f"{args.calls} calls, plain forward {1e3 * statistics.median(plain):.2f} ms (CPU, "
          f"1 thread), {statistics.median(f for _, f in times['plain']):.1f} minor faults a "
          f"forward, load {[round(x, 2) for x in os.getloadavg()]}; a minor page fault "
          f"{1e6 * statistics.median(fault_cost):.2f} us", flush=True)
    for label, values in times.items():
        if label == "plain":
            continue
        spent = [t for t, _ in values]
        faults = statistics.median(f for _, f in values)
        added = statistics.median([(t - p) * 1e6 for t, p in zip(spent, plain)])
        if "commit at the first read" in label:
            print(f"  {label}: {statistics.median(spent) * 1e6:.0f} us a forward (not in the "
                  "ratio)")
            continue
        ratios = [t / p for t, p in zip(spent, plain)]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        print(f"  {label}: recorded / plain {statistics.median(ratios):.4f} "
              f"(p25 {q1:.4f}, p75 {q3:.4f}), {added:.0f} us added a forward, "
              f"{faults:.1f} minor faults a forward", flush=True)
        if faults >= 1:
            # the same without what the new pages cost the OS (each round's own fault cost)
            net = [(t - f * c) / p for (t, f), p, c in zip(values, plain, fault_cost)]
            print(f"    without its page faults' cost: {statistics.median(net):.4f}", flush=True)
    if "base" in times:
        # the two probes of a round meet the same machine state: their difference is the
        # sharpest figure (standard error of a median ~ 1.25 sigma / sqrt(n), sigma ~ IQR / 1.35)
        diffs = [(t - b) * 1e6 for (t, _), (b, _) in zip(times["this tree"], times["base"])]
        q1, _, q3 = statistics.quantiles(diffs, n=4)
        se = 1.25 * (q3 - q1) / 1.35 / len(diffs) ** 0.5
        print(f"  this tree - base, per round: median {statistics.median(diffs):+.0f} us a "
              f"forward (standard error ~{se:.0f} us)", flush=True)


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
