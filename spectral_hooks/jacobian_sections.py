"""Report sections of the Jacobian view (METRICS.md section 2), built on linearize + linalg."""

from __future__ import annotations

from typing import Any


def jacobian_sections(analyzer: Any, *, jacobian: Any = None, bottleneck: bool = False,
                      reinit: bool = False, **extra: Any) -> dict:
    if extra:
        raise TypeError(f"unknown analyze() option(s): {sorted(extra)}")
    if jacobian is None and not bottleneck and not reinit:
        return {}
    raise NotImplementedError("the Jacobian view (jacobian=, bottleneck=, reinit=) is not "
                              "available in this version yet")
