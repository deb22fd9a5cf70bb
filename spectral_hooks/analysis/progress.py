"""One progress display over a whole analysis: per layer while the work runs, in units of
expected cost, with each section's own elapsed time and an estimate of what it has left.

    >>> progress = Progress({"power": ["F"], "spectra": ["F"]}, {"F": Work(2, 1.0)},
    ...                     enabled=False)
    >>> with progress.section("spectra"):       # read first: spectra computes F's spectra
    ...     for layer in progress.layers([0, 1], "F spectra", work="F"):
    ...         pass
    >>> progress.fraction                        # power shares them: nothing is left to do
    1.0

**Work, not sections.** The work of an analysis is a set of pools (``Work``): so many
per-layer steps of one computation (the spectra of every F_t; the trained model's Jacobian
metrics; its dense anchor Jacobians; ...), each step of an expected cost (``progress_plan``
estimates it from the shapes: a dense eig of F costs d^3, a Jacobian one application of the
block per matvec ...). A section names the pools it computes, so work that sections share is
counted once, by whichever section is read first: reading ``report.spectra`` before
``report.power`` shows the eigen-decompositions under "spectra", and "power" then finishes at
once without a jump of the display. A step counts where it is done: a loop over layers calls
:func:`layers` (``work=`` the pool; default the running section's first pool), and a step
repeated from a cache (a pool already complete) shows nothing.

**What a line says.** Each finished layer: the section, what was done, the pool's count, the
section's own elapsed time, an estimate of the time it has left (its remaining pools at the
rate its steps took so far) and the share of the whole analysis done:

    spectral_hooks: power: F spectra layer 3 (4/24): 12.3 s, about 52 s left (18% of the analysis)

and one line when the section ends (``power done in 48.1 s (51% of the analysis)``).

Where it goes: on a terminal, one tqdm bar (percent of the analysis), opened when a section
starts and closed when it ends, so no stale bar stays between lazily read sections; elsewhere
(a log, CI), the plain lines above on stderr, each as the layer finishes. ``enabled=False``
(``analyze(progress=False)``) or ``TQDM_DISABLE=1`` shows nothing; ``enabled=True`` shows it
even without a terminal (a bar only on a terminal); None (default) shows it.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

_CURRENT: contextvars.ContextVar[Optional["Progress"]] = contextvars.ContextVar(
    "spectral_hooks_progress", default=None)
_TRUE = ("1", "true", "yes", "on")


def env_disabled() -> bool:
    """``TQDM_DISABLE`` set to a true value (as tqdm reads it)."""
    return os.environ.get("TQDM_DISABLE", "").strip().lower() in _TRUE


@dataclass(frozen=True)
class Work:
    """A pool of ``units`` steps (layers) of one computation, each of expected ``cost``
    (relative units: only ratios between pools matter)."""

    units: int
    cost: float


def duration(seconds: float) -> str:
    """A short human duration.

        >>> duration(4.21), duration(125), duration(7260)
        ('4.2 s', '2 min 05 s', '2 h 01 min')
    """
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {int(seconds % 60):02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


class Progress:
    """Progress of one report's sections over shared pools of work (module docstring).

    ``sections``: section -> the pools it computes (its own first); a plain list of names
    gives each section its own pool of ``n_layers`` steps of cost 1. ``pools``: pool -> Work;
    a pool a section names but ``pools`` lacks is one step of cost 0.
    """

    def __init__(self, sections: Mapping[str, Sequence[str]] | Sequence[str],
                 pools: Optional[Mapping[str, Work]] = None, *, n_layers: int = 1,
                 enabled: Optional[bool] = None) -> None:
        if not isinstance(sections, Mapping):
            sections = {name: [name] for name in sections}
            pools = {name: Work(n_layers, 1.0) for name in sections} | dict(pools or {})
        pools = dict(pools or {})
        self.sections: dict[str, list[str]] = {name: list(names)
                                               for name, names in sections.items()}
        for names in self.sections.values():
            for name in names:
                pools.setdefault(name, Work(1, 0.0))
        self.pools: dict[str, Work] = pools
        self.steps: dict[str, int] = {name: 0 for name in pools}  # steps done per pool
        self.total: float = sum(w.units * w.cost for w in pools.values())
        self.done: float = 0.0
        self.enabled: bool = enabled is not False and not env_disabled()
        self.lines: list[str] = []  # every plain line (the bar's too), for tests and logs
        self._section: Optional[str] = None
        self._start = 0.0
        self._worked = 0.0  # cost of the steps taken in the running section
        self._first: Optional[tuple[float, float]] = None  # (time, cost) at its first step
        self._muted = False
        self._bar: Any = None

    # ------------------------------------------------------------------ counting
    @property
    def fraction(self) -> float:
        """The share of the analysis' expected cost done (1.0 when there is nothing to do)."""
        return min(1.0, self.done / self.total) if self.total > 0 else 1.0

    def left(self, pool: str) -> float:
        """Expected cost ``pool`` has left."""
        work = self.pools[pool]
        return max(0, work.units - self.steps[pool]) * work.cost

    def step(self, pool: Optional[str] = None, what: str = "") -> None:
        """One step of ``pool`` (default the running section's first) finished; ``what``
        names it ("F spectra layer 3"). Steps past a pool's count (a cached repeat) show
        nothing; steps outside any section are not counted."""
        if self._section is None or self._muted:
            return
        pool = pool if pool is not None else self.sections[self._section][0]
        if pool not in self.pools:
            pool = self.sections[self._section][0]
        work = self.pools[pool]
        if self.steps[pool] >= work.units:
            return
        self.steps[pool] += 1
        self.done += work.cost
        self._worked += work.cost
        if self._first is None:
            self._first = (self._elapsed(), self._worked)
        self._show(f"{what or pool} ({self.steps[pool]}/{work.units})")

    def layers(self, items: Iterable[Any], label: str = "", work: Optional[str] = None
               ) -> Iterator[Any]:
        """Iterate ``items`` (layers, or (layer, position) pairs), one step of ``work`` per
        finished layer (after its last item)."""
        items = list(items)

        def layer_of(item: Any) -> Any:
            return item[0] if isinstance(item, tuple) else item
        for i, item in enumerate(items):
            yield item
            if i + 1 == len(items) or layer_of(items[i + 1]) != layer_of(item):
                self.step(work, f"{label} layer {layer_of(item)}".strip())

    def each(self, items: Iterable[Any], name: Callable[[Any], str], work: Optional[str] = None
             ) -> Iterator[Any]:
        """Iterate ``items``, one step of ``work`` after each, named ``name(item)``."""
        for item in items:
            yield item
            self.step(work, name(item))

    # ------------------------------------------------------------------ sections
    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Around a section's computation; nested sections count in the outer one (their
        steps count in their pools)."""
        if self._section is not None or name not in self.sections:
            yield
            return
        self._section, self._start, self._worked = name, time.perf_counter(), 0.0
        self._first = None
        token = _CURRENT.set(self)
        self._open()
        try:
            yield
            for pool in self.sections[name]:  # what the section computed, steps or not
                self.done += self.left(pool)
                self.steps[pool] = max(self.steps[pool], self.pools[pool].units)
            self._emit(f"{name} done in {duration(self._elapsed())} "
                       f"({self._percent()} of the analysis)")
        finally:
            _CURRENT.reset(token)
            self._close()
            self._section = None

    def _elapsed(self) -> float:
        return time.perf_counter() - self._start

    def _percent(self) -> str:
        return f"{100 * self.fraction:.0f}%"

    def _estimate(self) -> str:
        """The running section's time left at the rate its steps took so far."""
        assert self._section is not None
        remaining = sum(self.left(pool) for pool in set(self.sections[self._section]))
        if remaining <= 0:
            return "nearly done"
        if self._worked <= 0:
            return "time left unknown"
        seconds, cost = self._elapsed(), self._worked
        if self._first is not None and cost > self._first[1]:  # the rate after the first step,
            seconds, cost = seconds - self._first[0], cost - self._first[1]  # its setup aside
        left = remaining * seconds / cost
        return "nearly done" if left < 0.05 else f"about {duration(left)} left"

    # ------------------------------------------------------------------ display
    def _show(self, what: str) -> None:
        if not self.enabled:
            return
        elapsed, estimate = duration(self._elapsed()), self._estimate()
        if self._bar is not None:
            self._bar.status = f"{what}: {elapsed}, {estimate}"
            self._bar.update(100 * self.fraction - self._bar.n)
            self._bar.refresh()  # once a finished layer, whatever tqdm's mininterval
        self._emit(f"{self._section}: {what}: {elapsed}, {estimate} "
                   f"({self._percent()} of the analysis)", bar=self._bar is not None)

    def _emit(self, line: str, *, bar: bool = False) -> None:
        self.lines.append(line)
        if not self.enabled or bar or self._bar is not None:
            return
        sys.stderr.write(f"spectral_hooks: {line}\n")
        sys.stderr.flush()

    def _open(self) -> None:
        if self.enabled and _is_terminal():
            self._bar = _bar_class()(total=100.0, initial=100 * self.fraction, leave=False,
                                     desc=f"spectral analysis: {self._section}",
                                     bar_format="{desc}: {percentage:3.0f}%|{bar}| {status}")
            self._bar.refresh()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _bar_class() -> Any:
    """tqdm with a ``status`` field for the bar's format (what was done, the section's time,
    the estimate), set as an attribute (tqdm's postfix would start with a comma)."""
    from tqdm.auto import tqdm

    class Bar(tqdm):  # type: ignore[misc, valid-type]
        status = ""

        @property
        def format_dict(self):  # noqa: D102
            return {**super().format_dict, "status": self.status}
    return Bar


def _is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def current() -> Optional[Progress]:
    """The display of the section being computed (None outside one)."""
    return _CURRENT.get()


def layers(items: Iterable[Any], label: str = "", work: Optional[str] = None
           ) -> Iterator[Any]:
    """``Progress.layers`` of the section being computed (plain iteration outside one)."""
    progress = _CURRENT.get()
    return iter(items) if progress is None else progress.layers(items, label, work)


def each(items: Iterable[Any], name: Callable[[Any], str], work: Optional[str] = None
         ) -> Iterator[Any]:
    """``Progress.each`` of the section being computed (plain iteration outside one)."""
    progress = _CURRENT.get()
    return iter(items) if progress is None else progress.each(items, name, work)


@contextlib.contextmanager
def muted() -> Iterator[None]:
    """No step counts inside: around work that a caller counts in its own steps, done on a
    subject whose pools are not the plan's (a transient re-initialised model whose label,
    "init", is that of the report's own init model)."""
    progress = _CURRENT.get()
    if progress is None or progress._muted:
        yield
        return
    progress._muted = True
    try:
        yield
    finally:
        progress._muted = False


def step(work: Optional[str] = None, what: str = "") -> None:
    """``Progress.step`` of the section being computed (nothing outside one)."""
    progress = _CURRENT.get()
    if progress is not None:
        progress.step(work, what)
