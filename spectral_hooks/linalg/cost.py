"""What an operator application costs: dispatch or FLOPs (issue 37's CPU cost rule).

Example::

    >>> flop_bound(128, "cpu"), flop_bound(1024, "cpu"), flop_bound(1024, "cuda")
    (False, True, False)
    >>> flop_bound(1024, "cpu", device_path=True)  # the accelerator's shape, on the CPU
    False

The solvers and the jacobian section choose their shape by what one operator application
costs. Where it costs dispatch (Python, kernel launches, host syncs: any accelerator, and the
CPU at a small width n), an application of many columns, or of several layers' operators at
once, costs about one column's, so wide blocks (``svds``' block Golub-Kahan) and layer groups
(``linearize.group``) cut the wall time by cutting sequential applications; on the d=128 CPU
proxy of a host-bound GPU (``benchmarks/host_bound.py``) they make the section 0.41x the
one-column-one-layer code. Where it costs FLOPs (the CPU at a large n: one GEMV-bound column of
a d=1024 block Jacobian is ~7 ms on one thread), a block method's extra columns (svds: ~4x as
many) and a group's padding cost their FLOPs and buy nothing, so the cheapest shape is one
column and one layer at a time, as ARPACK runs.

:func:`flop_bound` is that fact, in one place: True on the CPU from width
:data:`CPU_FLOP_BOUND_N` (measured: ``benchmarks/cost_crossover.py``,
``benchmarks/results/host_bound.md``). ``svds`` then defaults to the single-vector method and
the jacobian section (``JacobianOptions.group_layers=None``) to one layer at a time. A fixed
rule, not a timing taken at run time: the same call takes the same path, with the same values,
on every run. ``eigs`` needs no rule: on the CPU it runs one column a step at every width
(``eigs_parts.block_size_for``).
"""

from __future__ import annotations

from typing import Union

import torch

__all__ = ["CPU_FLOP_BOUND_N", "flop_bound"]

#: operator width from which an application costs FLOPs on the CPU (one column and one layer at
#: a time is then the cheapest shape; benchmarks/cost_crossover.py)
CPU_FLOP_BOUND_N = 512


def flop_bound(n: int, device: Union[str, torch.device], *, device_path: bool = False) -> bool:
    """Does one application of an operator of width ``n`` on ``device`` cost its FLOPs rather
    than its dispatch (module doc)? ``device_path``: False always (the accelerator's shape on
    any device, so a CPU run measures the code a GPU runs)."""
    return (not device_path and torch.device(device).type == "cpu"
            and n >= CPU_FLOP_BOUND_N)
