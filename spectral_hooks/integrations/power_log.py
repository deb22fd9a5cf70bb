"""What a training callback logs at one event: the power metrics, one layer at a time.

    >>> import spectral_hooks as sh
    >>> from transformers import GPT2Config, GPT2Model
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4))
    >>> probe = sh.instrument(model)
    >>> _ = model(torch.arange(8)[None])
    >>> metrics = power_metrics(probe, columns=("gap_ratio", "gamma"))
    >>> sorted(metrics)[:2]
    ['spectral/layer_00/gamma', 'spectral/layer_00/gap_ratio']
    >>> probe.remove()

The values are ``probe.analyze(power=...)``'s, computed by the same pipeline (tested equal,
row for row): per layer, its factors are read by ``anatomy.weights.layer_factors``, its
spectrum takes the route of ``metrics.spectrum.power_route`` (dense eig below
``MATRIX_FREE_D``, exact from the factors where they are thin, else top-k by Krylov) through
:func:`spectral_hooks.analysis.power.layer_power_spectrum`, and the row is
``metrics.power.power_row``'s. Nothing is cached between events (the weights changed). Weights
that are FSDP2 ``DTensor`` shards are gathered one layer at a time (a collective: every rank
calls :func:`power_metrics`, only the rank with ``compute=True`` does the arithmetic). With
``across_ranks=True`` (what a training event does under torch.distributed) every rank's
recorded tokens of the layer are gathered to rank 0 as well, so the data-dependent columns
(:data:`DATA_COLUMNS`) describe the global batch.

:func:`jacobian_metrics` is the rarer event (``jacobian_every``): the ``jacobian`` table of
``probe.analyze(jacobian=...)``, flattened to ``spectral/layer_03/jacobian/top_eig_abs``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Optional

import pandas as pd
import torch
from torch import Tensor

from ..analysis.columns import SCHEMAS
from ..analysis.layer_kinds import with_layer_kinds
from ..analysis.options import PowerOptions
from ..analysis.power import PVALUES, layer_power_spectrum
from ..anatomy.weights import layer_operators
from ..errors import OptionError, UnknownOptionError
from ..metrics.power import REFERENCE_COLUMNS, power_columns, power_row
from ..metrics.spectrum import TOP_K
from ..metrics.stats import with_adjusted
from .distributed import gather_rows, token_counts
from .loggers import is_scalar_column, refuse_text_columns

JACOBIAN_COLUMNS = ("top_eig_abs",)
#: The power-table columns computed from the recorded tokens (the others are weight-only):
#: under torch.distributed a training event computes them from every rank's tokens.
DATA_COLUMNS = frozenset({"gamma_in", "gamma", "lift", "gamma2_in", "gamma2", "rho",
                          "rho_pvalue", "n_tokens", "mean_cos", "collapse_residual", "erank",
                          "gamma_ref"})
#: The options of a logging event: those of ``analyze(iterate=, fold_norm=, power={...})``
#: (every PowerOptions field but ``direction``).
POWER_OPTIONS = ("iterate", "fold_norm",
                 *(f.name for f in dataclasses.fields(PowerOptions) if f.name != "direction"))
#: the capture points a power event reads (the callbacks record these by default)
POWER_CAPTURES = ("resid_pre", "resid_post")


def check_power_options(options: dict[str, Any]) -> dict[str, Any]:
    """The power options a logging event accepts (:data:`POWER_OPTIONS`, as in
    ``probe.analyze``), ``progress`` dropped; UnknownOptionError for any other.

        >>> check_power_options({"full": False, "progress": False})
        {'full': False}
    """
    unknown = sorted(set(options) - set(POWER_OPTIONS) - {"progress"})
    if unknown:
        raise UnknownOptionError("analyze_options", unknown, list(POWER_OPTIONS))
    return {k: v for k, v in options.items() if k != "progress"}


def _name(prefix: str, layer: int, column: str) -> str:
    name = f"layer_{layer:02d}/{column}"
    return f"{prefix}/{name}" if prefix else name


def _rank() -> int:
    return torch.distributed.get_rank()


def _layer_tokens(probe: Any, i: int, layer: int, counts: Optional[list],
                  across_ranks: bool) -> list[Optional[Tensor]]:
    """[resid_pre, resid_post] of ``layer`` (float64 CPU, or None): this rank's, or with
    ``across_ranks`` every rank's, gathered to rank 0 (a collective)."""
    rec, ov_tokens = probe.recording, probe.anatomy.ov_tokens  # the stream F acts on
    points = [c for c in POWER_CAPTURES if c in rec.capture]
    if not across_ranks:
        keeps = rec.store != "stats" and bool(rec.steps)
        return [ov_tokens(rec.tokens(c, layer)).to("cpu", torch.float64)
                if keeps and c in points else None for c in POWER_CAPTURES]
    if counts is None:
        return [None, None]
    local = (torch.cat([ov_tokens(rec.tokens(c, layer)).to("cpu", torch.float64)
                        for c in points], dim=1) if counts[i][_rank()] else None)
    rows = gather_rows(local, counts[i], probe.anatomy.d_model * len(points))  # collective
    if rows is None:
        return [None, None]
    parts = dict(zip(points, rows.chunk(len(points), dim=1)))
    return [parts[c].contiguous() if c in parts else None for c in POWER_CAPTURES]


def power_rows(probe: Any, *, columns: Optional[Iterable[str]] = None, iterate: str = "F",
               fold_norm: bool = False, full: Optional[bool] = None, k: int = TOP_K,
               reference_layer: Optional[int] = None, compute: bool = True,
               across_ranks: bool = False) -> pd.DataFrame:
    """``probe.analyze(iterate=, fold_norm=, power={"full", "k", "reference_layer"}).power``,
    the same rows and columns, computed one layer at a time (see the module docstring).

        >>> import spectral_hooks as sh
        >>> from transformers import GPT2Config, GPT2Model
        >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4))
        >>> with sh.instrument(model) as probe:
        ...     _ = model(torch.arange(8)[None])
        ...     rows = power_rows(probe)
        >>> rows["layer"].tolist(), rows["ref_layer"].tolist()
        ([0, 1], [1, 1])

    ``columns``: only what these columns need is computed (tokens, gathered across ranks or
    not, for :data:`DATA_COLUMNS`; the reference layer's spectrum for the reference columns);
    the other columns of a row may then be NaN. None: every column.
    ``compute=False``: only take part in the collectives (gathers of sharded weights, and of
    tokens with ``across_ranks``) and return an empty table.
    """
    wanted = None if columns is None else set((columns,) if isinstance(columns, str) else columns)
    options = PowerOptions(full=full, k=k, reference_layer=reference_layer)  # checks them
    rec, anatomy = probe.recording, probe.anatomy
    L = anatomy.n_layers
    if reference_layer is not None and not -L <= reference_layer < L:
        raise OptionError("reference_layer", reference_layer, f"a layer index in [-{L}, {L})")
    counts = None
    if across_ranks:
        if compute and torch.distributed.get_rank() != 0:
            raise ValueError("power_metrics(across_ranks=True): the tokens are gathered to "
                             "rank 0, so only rank 0 may compute (compute=False elsewhere)")
        points = [c for c in POWER_CAPTURES if c in rec.capture]
        if rec.store != "stats" and points and (wanted is None or DATA_COLUMNS & wanted):
            counts = token_counts(rec, points)  # collective
    operators = layer_operators(anatomy, fold_norm=fold_norm)

    def spectrum_of(layer: int):
        factors = operators.factors(layer)  # a collective for FSDP2 shards
        return layer_power_spectrum(factors, iterate=iterate, full=options.full,
                                    k=options.k) if compute else None

    r, s_r, reference = None, None, None  # every rank reads layer r once, as every other
    ov = set(anatomy.ov_layers)  # a hybrid's Mamba / linear-attention layers have no F
    if ov and (wanted is None or wanted & set(REFERENCE_COLUMNS)):
        r = max(ov) if reference_layer is None else reference_layer % L
        s_r = spectrum_of(r)
        reference = (r, s_r.B) if s_r is not None else None
    rows = []
    for i, layer in enumerate(rec.layers):
        if layer not in ov:
            continue
        s = s_r if layer == r else spectrum_of(layer)
        tokens = _layer_tokens(probe, i, layer, counts, across_ranks)
        if compute:
            assert s is not None
            rows.append(power_row(s, *tokens, layer=layer, reference=reference))
    table = with_adjusted(pd.DataFrame(rows, columns=list(power_columns())), PVALUES)
    return with_layer_kinds(table, anatomy, SCHEMAS["power"])


def power_metrics(probe: Any, *, columns: Iterable[str], prefix: str = "spectral",
                  iterate: str = "F", fold_norm: bool = False, full: Optional[bool] = None,
                  k: int = TOP_K, reference_layer: Optional[int] = None, compute: bool = True,
                  across_ranks: bool = False) -> dict[str, float]:
    """``{"spectral/layer_03/gap_ratio": ..., ...}`` for every recorded layer (NaN skipped):
    :func:`power_rows`, flattened.

    ``columns``: power-table columns. ``iterate``, ``fold_norm``, ``full``, ``k``,
    ``reference_layer``: as in ``probe.analyze(iterate=, fold_norm=, power={...})``.
    ``compute=False``: only take part in the collectives (gathers of sharded weights, and of
    tokens with ``across_ranks``) and return ``{}``.
    ``across_ranks=True`` (a collective: every rank calls it, with the same layers, captures
    and columns): the data-dependent columns (:data:`DATA_COLUMNS`) are computed on rank 0
    from every rank's recorded tokens, concatenated in rank order (gathered one layer at a
    time; a rank that recorded nothing contributes no token): the values one process would
    compute from all of them. Only rank 0 may compute then. The weight-only columns need no
    communication (the weights are the same on every rank, or gathered whole when sharded).

        >>> import spectral_hooks as sh
        >>> from transformers import GPT2Config, GPT2Model
        >>> model = GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=4))
        >>> with sh.instrument(model) as probe:
        ...     _ = model(torch.arange(8)[None])
        ...     list(power_metrics(probe, columns=["abs_lambda1"]))
        ['spectral/layer_00/abs_lambda1']
    """
    columns = (columns,) if isinstance(columns, str) else tuple(columns)
    rows = power_rows(probe, columns=columns, iterate=iterate, fold_norm=fold_norm, full=full,
                      k=k, reference_layer=reference_layer, compute=compute,
                      across_ranks=across_ranks)
    missing = [c for c in columns if c not in rows.columns]
    if missing:
        raise KeyError(f"power table has no column {missing[0]!r}; available: "
                       f"{list(rows.columns)}")
    refuse_text_columns(rows, columns)
    out: dict[str, float] = {}
    for row in rows.to_dict("records"):
        for column in columns:
            value = float(row[column])
            if not math.isnan(value):
                out[_name(prefix, int(row["layer"]), column)] = value
    return out


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
                   and c.endswith(column.split("*")[1]) and not c.endswith("_se")
                   and is_scalar_column(table[c])]  # a pattern skips text (mixer, token)
        if not matches:
            raise KeyError(f"jacobian table has no column {column!r}; available: "
                           f"{list(table.columns)}")
        wanted += matches
    refuse_text_columns(table, wanted)
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
