"""Sections ``bottleneck`` (end-to-end Jacobians, ablations, init control) and ``propagation``.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> subject = probe.subject   # what probe.analyze() hands to each section
    >>> table = bottleneck_section(subject, AnalyzeOptions(bottleneck=True))
    >>> sorted(set(table["variant"])), int(table["depth"].max())  # trained, and two ablations
    (['schur', 'symmetric', 'trained'], 2)
    >>> propagation_section(subject, AnalyzeOptions())["layer"].tolist()
    [0, 1]
"""

from __future__ import annotations

import warnings
from typing import Any

import pandas as pd

from ..errors import ConvergenceWarning, OptionError, fallback
from ..metrics.bottleneck import (
    bottleneck_table,
    end_to_end_table,
    propagation_table,
    single_layer_ablation_table,
)
from ..metrics.jacobian import SCHUR_MAX_D
from . import progress
from .jacobian import JacobianView
from .option_values import depths_of
from .options import AnalyzeOptions
from .reinit import init_subject
from .subject import Subject


def variant_table(view: JacobianView, variant: str) -> pd.DataFrame:
    """One variant's rows. trained/init: the end-to-end Jacobian P_l itself for a
    bidirectional model (JVPs through the whole stack), the product of per-position blocks for
    a causal one (where it is exact); the ablations are products of modified blocks, every
    layer at once (``ablated_layer`` -1, every depth) and, for causal models (where the product
    is the end-to-end Jacobian), one layer at a time (its index, at full depth). The
    ``computation`` column says which. Matrix-free rows (``truncated``) rank the top
    ``bottleneck_k`` singular values and carry the SLQ estimates of the full-spectrum erank and
    surviving (``erank_est``, ``surviving_est``, with ``_se``) unless ``bottleneck_probes`` is 0."""
    o, d = view.options, view.subject.anatomy.residual_width
    if variant == "schur" and d > SCHUR_MAX_D:
        raise OptionError("jacobian.ablations", o.ablations,
                          f"no 'schur' above d_model={SCHUR_MAX_D} (this model: {d})",
                          hint="the schur ablation needs the complete Schur form of every "
                          "dense J_l; a top-k partial Schur form would be a different ablation")
    dense = variant == "schur" or view.dense_products
    k = min(o.bottleneck_k, d - 2)
    common: dict[str, Any] = dict(k=k, dense=dense, seed=o.seed, n_probes=o.bottleneck_probes,
                  steps=o.bottleneck_steps)
    depths = depths_of(o.bottleneck_depths, len(view.layers))
    if variant in ("trained", "init") and not view.subject.anatomy.causal:
        table = end_to_end_table(view.end_to_end(dense), variant=variant, depths=depths,
                                 **common)
        table["computation"] = "end_to_end"
        return table
    operators = view.dense_chain() if dense else view.chain()
    table = bottleneck_table(operators, variant=variant, depths=depths, **common)
    if variant in ("symmetric", "schur") and view.subject.anatomy.causal:
        table = pd.concat([table, single_layer_ablation_table(
            operators, variant=variant, layers=view.layers, **common)], ignore_index=True)
    table["computation"] = "product"
    return table


def bottleneck_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """The ``bottleneck`` table: per variant (the trained stack, each ablation of
    ``jacobian.ablations``, and the re-initialised control when ``reinit`` is on), the rank
    profile of the end-to-end Jacobians at the default position.

    Args:
        subject: what was recorded (consecutive layers, tokens kept).
        options: the analysis options; ``options.jacobian_options`` sets k, the ablations,
            the probes and ``init_seed``.

    Returns:
        One row per (variant, ablated layer, depth): ``erank``, ``participation_ratio``,
        ``stable_rank``, ``surviving``, ``sigma_max``, ... (METRICS.md, "Bottleneck").
    """
    o = options.jacobian_options
    view = JacobianView(subject, o)
    variants = ["trained"] + list(o.ablations)
    if "schur" in variants and subject.anatomy.residual_width > SCHUR_MAX_D:
        fallback("bottleneck:schur_skipped", f"the schur ablation is skipped: d_model="
                 f"{subject.anatomy.residual_width} > SCHUR_MAX_D={SCHUR_MAX_D} (it needs the complete "
                 "Schur form of every dense J_l; replacing only a top-k Schur block would be a "
                 "different ablation, so no matrix-free version is offered)")
        variants.remove("schur")
    frames = [variant_table(view, v) for v in progress.each(
        variants, lambda v: f"variant {v}", work="bottleneck")]
    if options.reinit:
        init = JacobianView(init_subject(subject, seed=o.init_seed), o)
        frames.append(variant_table(init, "init"))
        progress.step("bottleneck", "variant init")
    table = pd.concat(frames, ignore_index=True)
    _warn_wide_quadrature(table, o.bottleneck_steps)
    return table


#: the quadrature bracket of erank_est is "wide" where its half-width exceeds this many of its
#: Monte Carlo standard errors: the quadrature, not the probes, then limits the estimate
WIDE_BRACKET_SE = 2.0


def _warn_wide_quadrature(table: pd.DataFrame, steps: int) -> None:
    """One ConvergenceWarning naming the rows whose erank_est bracket is wide."""
    if "erank_est_lo" not in table.columns:
        return
    half = (table["erank_est_hi"] - table["erank_est_lo"]) / 2
    wide = table[half > WIDE_BRACKET_SE * table["erank_est_se"]]
    if wide.empty:
        return
    rows = ", ".join(f"{r.variant} depth {r.depth}" for r in wide.head(6).itertuples())
    more = f" and {len(wide) - 6} more" if len(wide) > 6 else ""
    warnings.warn(
        f"bottleneck: the Lanczos quadrature of erank_est is coarser than its Monte Carlo error "
        f"at {rows}{more}: [erank_est_lo, erank_est_hi] is wider than +-{WIDE_BRACKET_SE:g} "
        f"erank_est_se there; raise jacobian bottleneck_steps (now {steps}) to narrow it",
        ConvergenceWarning, stacklevel=3)


def propagation_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """The ``propagation`` table: a random perturbation (``jacobian.seed``) pushed through
    the chain of token Jacobians at the default position, one row per layer (``norm``,
    ``growth``, ``alignment_top``, ``alignment_in``, ``alignment_null``; see
    :func:`~spectral_hooks.metrics.bottleneck.propagation_table`).
    """
    o = options.jacobian_options
    return propagation_table(JacobianView(subject, o).chain(), seed=o.seed)
