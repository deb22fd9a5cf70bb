"""At most n CPU threads for torch's kernels called from the current Python thread, without a
process-wide setting: :func:`cpu_threads`.

    >>> import torch
    >>> with cpu_threads(1):
    ...     torch.get_num_threads()
    1

Why not ``torch.set_num_threads``: besides this thread's OpenMP and MKL counts it writes
torch's process-wide default, which every thread that first runs a torch kernel meanwhile
keeps for good (measured: a thread started while it was lowered reports 1 thread after). Both
counts it needs are per thread already: OpenMP's ``nthreads-var`` (``omp_set_num_threads``
acts on the calling thread; ATen's ``parallel_for`` and ``torch.get_num_threads`` read
``omp_get_max_threads``) and MKL's ``mkl_set_num_threads_local`` (MKL's LAPACK / BLAS, which
after a ``torch.set_num_threads`` call in this thread no longer follows the OpenMP count). So
:func:`cpu_threads` sets just those two for the calling thread, through the symbols of the
libraries torch has loaded (its OpenMP runtime; ``libtorch_cpu``, where MKL is linked in), and
restores both after; other threads, and threads started meanwhile, keep their counts. Where
torch has no such OpenMP runtime or MKL (another build), the missing part is left as it is
(:data:`CONTROLS` says what was found). ``threadpoolctl`` would not do: it sees the OpenMP
runtime but not the MKL inside libtorch_cpu, and its BLAS limits (OpenBLAS) are process-wide.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch

__all__ = ["cpu_threads", "thread_controls"]


class ThreadControls(NamedTuple):
    """The per-thread count setters found in the process (None: not there)."""

    omp_set: Optional[Any]  # ctypes functions
    omp_get: Optional[Any]
    mkl_set_local: Optional[Any]


def _symbol(libs: list[ctypes.CDLL], name: str) -> Optional[Any]:
    for lib in libs:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


@functools.cache
def thread_controls() -> ThreadControls:
    """The OpenMP and MKL per-thread setters of the libraries torch loaded (looked up once).

        >>> thread_controls().omp_get is not None or not torch.backends.openmp.is_available()
        True
    """
    libs = []
    for path in sorted((Path(torch.__file__).parent / "lib").glob("*torch_cpu.*")):
        try:  # loaded already: dlopen hands back the same library, whose lookups reach the
            libs.append(ctypes.CDLL(str(path)))  # OpenMP runtime it was linked with
        except OSError:  # not loadable by path: its setters are looked up in the process
            continue     # below, or reported missing (ThreadControls' None: counts untouched)
    try:
        libs.append(ctypes.CDLL(None))  # the symbols loaded with RTLD_GLOBAL
    except (OSError, TypeError):  # no such handle on Windows
        pass
    omp_set, omp_get = _symbol(libs, "omp_set_num_threads"), _symbol(libs, "omp_get_max_threads")
    if omp_set is None or omp_get is None:
        omp_set = omp_get = None
    else:
        omp_set.argtypes, omp_get.restype = [ctypes.c_int], ctypes.c_int
    mkl = _symbol(libs, "MKL_Set_Num_Threads_Local")  # the C interface (by value; the
    # lower-case names are the Fortran one, by reference)
    if mkl is not None:
        mkl.argtypes, mkl.restype = [ctypes.c_int], ctypes.c_int
    return ThreadControls(omp_set, omp_get, mkl)


@contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """At most ``n`` (>= 1) threads for torch's CPU kernels (ATen's OpenMP loops, MKL's LAPACK
    and BLAS) called from this thread inside; its counts restored after, nothing else touched."""
    c = thread_controls()
    before = c.omp_get() if c.omp_get is not None else torch.get_num_threads()
    if c.omp_set is None and c.mkl_set_local is None:
        yield
        return
    if c.omp_set is not None:
        c.omp_set(max(1, min(n, before)))
    mkl_before = c.mkl_set_local(max(1, min(n, before))) if c.mkl_set_local is not None else 0
    try:
        yield
    finally:
        if c.mkl_set_local is not None:
            c.mkl_set_local(mkl_before)  # 0: back to MKL's global count, as it was
        if c.omp_set is not None:
            c.omp_set(before)
