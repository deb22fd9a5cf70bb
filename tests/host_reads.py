"""Counting host reads with ``torch.profiler``, as ``benchmarks/host_bound.py`` counts them: an
``aten::_local_scalar_dense`` (every ``.item()``, ``float(t)``, ``bool(t)``) that is not part of
host-side work on host copies, which touches no device."""

from __future__ import annotations

from typing import Iterable

#: host-side work whose reads touch no device: LAPACK's workspace queries inside a CPU eig /
#: eigh / svd, and the library's marked host blocks
HOST_WORK = ("aten::linalg_eig", "aten::linalg_eigvals", "aten::linalg_eigh",
             "aten::_linalg_svd", "aten::linalg_svd", "spectral_hooks.host")


def host_reads(events: Iterable, host_work: Iterable[str] = HOST_WORK) -> int:
    """The reads among profiler ``events`` outside ``host_work`` ranges."""
    host_work = tuple(host_work)
    reads = 0
    for e in events:
        if e.name != "aten::_local_scalar_dense":
            continue
        p = e.cpu_parent
        while p is not None and p.name not in host_work:
            p = p.cpu_parent
        reads += p is None
    return reads
