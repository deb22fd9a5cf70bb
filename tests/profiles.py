"""Test profiles: ``make test`` runs the quick one, ``make test-all`` (SPECTRAL_HOOKS_FULL=1)
everything. A parametrized test keeps a covering subset of its cases in the quick profile and
marks the rest full-only, so every case still runs in the full profile and the quick suite
stays under ~15 minutes on 2 cores.

    @pytest.mark.parametrize("family", quick_subset(FAMILIES, keep={"gpt2", "bert"}))
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

import pytest

FULL = os.environ.get("SPECTRAL_HOOKS_FULL") == "1"
full_only = pytest.mark.skipif(not FULL, reason="full profile only: SPECTRAL_HOOKS_FULL=1")


def quick_subset(values: Iterable, *, keep: Callable | set) -> list:
    """``values`` as pytest params, those not kept marked full-only. ``keep``: a set of values
    or a predicate on one value (for tuples of stacked parametrizations)."""
    kept = keep if callable(keep) else (lambda v: v in keep)
    return [v if kept(v) else pytest.param(*(v if isinstance(v, tuple) else (v,)),
                                           marks=full_only) for v in values]
