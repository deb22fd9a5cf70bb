"""What a training callback logs at one event: the power metrics, cheaply, one layer at a time.

    >>> metrics = power_metrics(probe, columns=("gap_ratio", "gamma"))   # doctest: +SKIP
    >>> metrics["spectral/layer_03/gap_ratio"]                           # doctest: +SKIP

The values are ``probe.analyze(power=True).power``'s (tested against it), computed the way a
logging event can afford (:mod:`spectral_hooks.metrics.power_factors`): per layer, W_O and W_V
are read, F's spectrum is dense up to d = 1024 and a top-k ``eigs`` on the thin products
x -> W_O (W_V x) above it, then alignment and consensus of the recorded tokens. Nothing is
cached between events (the weights changed). Weights that are FSDP2 ``DTensor`` shards are
gathered one layer at a time (``full_tensor()``, a collective: every rank calls
:func:`power_metrics`, only the rank with ``compute=True`` does the arithmetic). With
``across_ranks=True`` (what a training event does under torch.distributed) every rank's
recorded tokens of the layer are gathered to rank 0 as well, so the data-dependent columns
(:data:`DATA_COLUMNS`) describe the global batch.

:func:`jacobian_metrics` is the rarer event (``jacobian_every``): the ``jacobian`` table of
``probe.analyze(jacobian=...)``, flattened to ``spectral/layer_03/jacobian/top_eig_abs``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional, cast

import torch
from torch import Tensor

from ..anatomy.wrappers import weights_in
from ..metrics.power_factors import TRAINING_DENSE_LIMIT, power_row_from_factors
from ..metrics.spectrum import TOP_K
from .distributed import gather_rows, token_counts

JACOBIAN_COLUMNS = ("top_eig_abs",)
#: The power-table columns computed from the recorded tokens (the others are weight-only):
#: under torch.distributed a training event computes them from every rank's tokens.
DATA_COLUMNS = frozenset({"gamma_in", "gamma", "lift", "gamma2_in", "gamma2", "rho",
                          "rho_pvalue", "n_tokens", "mean_cos", "collapse_residual", "erank"})
_OPTIONS = ("iterate", "fold_norm", "dense_limit", "top_k")


def full(tensor: Optional[Tensor]) -> Optional[Tensor]:
    """``tensor`` itself, or the whole tensor of a DTensor shard (a collective)."""
    gather = getattr(tensor, "full_tensor", None)
    return cast(Tensor, gather()) if callable(gather) else tensor


def check_power_options(options: dict[str, Any]) -> dict[str, Any]:
    """The power options a logging event accepts (see :func:`power_metrics`)."""
    from ..errors import UnknownOptionError

    unknown = sorted(set(options) - set(_OPTIONS) - {"progress"})
    if unknown:
        raise UnknownOptionError("analyze_options", unknown, list(_OPTIONS))
    return {k: v for k, v in options.items() if k != "progress"}


def _name(prefix: str, layer: int, column: str) -> str:
    name = f"layer_{layer:02d}/{column}"
    return f"{prefix}/{name}" if prefix else name


def power_metrics(probe: Any, *, columns: Iterable[str], prefix: str = "spectral",
                  iterate: str = "F", fold_norm: bool = False,
                  dense_limit: int = TRAINING_DENSE_LIMIT, top_k: int = TOP_K,
                  compute: bool = True, across_ranks: bool = False) -> dict[str, float]:
    """``{"spectral/layer_03/gap_ratio": ..., ...}`` for every recorded layer (NaN skipped).

    ``columns``: power-table columns. ``iterate``, ``fold_norm``: as in ``probe.analyze``.
    ``dense_limit``, ``top_k``: see :mod:`spectral_hooks.metrics.power_factors`.
    ``compute=False``: only take part in the collectives (gathers of sharded weights, and of
    tokens with ``across_ranks``) and return ``{}``.
    ``across_ranks=True`` (a collective: every rank calls it, with the same layers, captures
    and columns): the data-dependent columns (:data:`DATA_COLUMNS`) are computed on rank 0
    from every rank's recorded tokens, concatenated in rank order (gathered one layer at a
    time; a rank that recorded nothing contributes no token): the values one process would
    compute from all of them. Only rank 0 may compute then. The weight-only columns need no
    communication (the weights are the same on every rank, or gathered whole when sharded).
    """
    columns = (columns,) if isinstance(columns, str) else tuple(columns)
    rec, anatomy = probe.recording, probe.anatomy
    keeps = rec.store != "stats" and bool(rec.steps)
    points = [c for c in ("resid_pre", "resid_post") if c in rec.capture]
    counts = None
    if across_ranks:
        if compute and torch.distributed.get_rank() != 0:
            raise ValueError("power_metrics(across_ranks=True): the tokens are gathered to "
                             "rank 0, so only rank 0 may compute (compute=False elsewhere)")
        if rec.store != "stats" and points and DATA_COLUMNS.intersection(columns):
            counts = token_counts(rec, points)  # collective
    out: dict[str, float] = {}
    for i, layer in enumerate(rec.layers):
        part = anatomy.layers[layer]
        with weights_in(part.block, where=f"layer {layer}"):  # accelerate offload / meta
            W_O, W_V = full(part.output_weights()), full(part.value_weights())
            gain = full(part.attn_norm_weight()) if fold_norm else None
            W_O, W_V = cast(Tensor, W_O).to("cpu", torch.float64), cast(Tensor, W_V).to("cpu", torch.float64)
        if across_ranks:
            tokens = [None, None]
            if counts is not None:
                local = (torch.cat([rec.tokens(c, layer).to("cpu", torch.float64)
                                    for c in points], dim=1) if counts[i][_rank()] else None)
                rows = gather_rows(local, counts[i], W_O.shape[1] * len(points))  # collective
                if rows is not None:
                    parts = dict(zip(points, rows.chunk(len(points), dim=1)))
                    tokens = [parts[c].contiguous() if c in parts else None
                              for c in ("resid_pre", "resid_post")]
        else:
            tokens = [rec.tokens(c, layer) if keeps and c in rec.capture else None
                      for c in ("resid_pre", "resid_post")]
        if not compute:
            continue
        row = power_row_from_factors(W_O, W_V, *tokens, layer=layer, gain=gain,
                                     iterate=iterate, dense_limit=dense_limit, top_k=top_k)
        for column in columns:
            if column not in row:
                raise KeyError(f"power table has no column {column!r}; available: "
                               f"{list(row)}")
            value = float(row[column])
            if not math.isnan(value):
                out[_name(prefix, layer, column)] = value
    return out


def _rank() -> int:
    return torch.distributed.get_rank()


def jacobian_metrics(probe: Any, *, options: Optional[dict[str, Any]] = None,
                     columns: Iterable[str] = JACOBIAN_COLUMNS,
                     prefix: str = "spectral") -> dict[str, float]:
    """The ``jacobian`` table of ``probe.analyze(jacobian=options)`` as flat scalars:
    ``spectral/layer_03/jacobian/top_eig_abs`` (``.../jacobian/pos_12/...`` when several
    positions are linearised). Columns named with ``*`` take the table's k. The blocks are
    replayed in eval mode (no dropout: a training model's Jacobian would be a random draw);
    each module's training flag is restored afterwards."""
    modules = list(probe.model.modules())
    flags = [m.training for m in modules]
    try:
        probe.model.eval()
        table = probe.analyze(power=False, jacobian=dict(options or {"k": 8}),
                              progress=False).jacobian
    finally:
        for module, flag in zip(modules, flags):
            module.training = flag
    table = table[table["variant"] == "trained"] if "variant" in table else table
    several = table["position"].nunique() > 1
    wanted = []
    for column in ((columns,) if isinstance(columns, str) else tuple(columns)):
        if column in table.columns:
            wanted.append(column)
            continue
        matches = [c for c in table.columns
                   if "*" in column and c.startswith(column.split("*")[0])
                   and c.endswith(column.split("*")[1]) and not c.endswith("_se")]
        if not matches:
            raise KeyError(f"jacobian table has no column {column!r}; available: "
                           f"{list(table.columns)}")
        wanted += matches
    out: dict[str, float] = {}
    for _, row in table.iterrows():
        where = f"jacobian/pos_{int(row['position'])}" if several else "jacobian"
        for column in wanted:
            value = float(row[column])
            if not math.isnan(value):
                out[_name(prefix, int(row["layer"]), f"{where}/{column}")] = value
    return out


def timed_event(fn: Callable[..., Any], *, devices: Iterable[int] = (), key: str = "spectral/seconds"
                ) -> dict[str, float]:
    """``fn()`` under ``torch.no_grad()`` and a forked RNG (training unchanged), with its
    wall time added under ``key``: the cost of the event, logged with it."""
    import time

    start = time.perf_counter()
    with torch.random.fork_rng(devices=list(devices)), torch.no_grad():
        out = fn()
    out[key] = time.perf_counter() - start
    return out
