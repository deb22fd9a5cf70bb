"""Interleaved A/B timing of training steps (A: plain, B: the same steps with the spectral
tracker), shared by the overhead benchmarks: the timed steps and each round's ratios."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional


def timed_steps(step: Callable[[int], None], optimizer: Any, n: int, tracker: Any = None,
                first: int = 1) -> tuple[float, float, list]:
    """Run ``n`` training steps (``step(i)`` does the forward and backward of step i; then the
    tracker's ``step`` where given, and the optimizer's). Returns (wall seconds, CPU seconds,
    the seconds of each logged event)."""
    events = []
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        step(i)
        if tracker is not None:
            metrics: Optional[dict] = tracker.step(first + i)
            if metrics:
                events.append(metrics["spectral/seconds"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start, time.process_time() - cpu, events


def record_round(label: str, walls: dict, cpus: dict, every: int, ratios: list,
                 cpu_ratios: list, plain: list) -> None:
    """Append the round's wall-time ratio B / A, CPU-time ratio and plain seconds a step to
    ``ratios``, ``cpu_ratios`` and ``plain``, and print one line with the machine's load."""
    ratios.append(walls["B"] / walls["A"])
    cpu_ratios.append(cpus["B"] / cpus["A"])
    plain.append(walls["A"] / every)
    print(f"  {label}: A {walls['A']:.1f} s, B {walls['B']:.1f} s, ratio {ratios[-1]:.3f} "
          f"(CPU time {cpu_ratios[-1]:.3f}), load {os.getloadavg()[0]:.1f}", flush=True)
