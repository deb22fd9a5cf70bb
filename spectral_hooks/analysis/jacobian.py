"""The Jacobian view of one subject: block operators, dense Jacobians and their metrics.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> subject = probe.subject   # what probe.analyze() hands to each section
    >>> view = JacobianView(subject, AnalyzeOptions(jacobian=True).jacobian_options)
    >>> view.table()[["variant", "layer", "position", "dense"]]   # the last real token, exact
       variant  layer  position  dense
    0  trained      0         7   True
    1  trained      1         7   True

Every operator, dense matrix and metric is computed once per state of the weights and the
recording (``subject.memo``) and shared by the sections that need it (jacobian, spectra,
trends, bottleneck, topology).

Exact or matrix-free (``JacobianOptions.dense``): None (the default) computes exactly - the
full J, then dense linear algebra - where d_model <= DENSE_AUTO_MAX_D and matrix-free above.
The threshold is a constant, calibrated once by ``benchmarks/dense_threshold.py`` (where the
exact computation stops costing about as much as the Krylov run), never a timing taken at run
time. Each row says which was used (``dense``); the metadata's ``jacobian`` entry says why and
which exact-only columns a matrix-free table lacks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Union

import pandas as pd
import torch
from torch import Tensor

from ..errors import OptionError, RecordingError
from ..linalg import IdentityOperator, LinearOperator
from ..linalg.cost import CPU_FLOP_BOUND_N, flop_bound
from ..linalg.materialize import COLUMN_COST, WIDTH
from ..linearize import BlockJacobian, block_jacobian
from ..linearize.end_to_end import end_to_end_jacobians, end_to_end_operators
from ..linearize.group import BlockGroup, group_capacity
from ..metrics.jacobian import (
    MATRIX_FREE_ABSENT,
    SCHUR_MAX_D,
    JacobianMetrics,
    apply_all,
    eigen_rows,
    jacobian_metrics,
    jacobian_metrics_batch,
    jacobian_row,
)
from ..metrics.jacobian_nulls import NULL_MC_MAX_D
from ..metrics.stats import sample_summary
from ..metrics.topology import UnitNorms, amplification, log_gain
from . import progress
from .options import AnalyzeOptions, JacobianOptions
from .subject import Subject
from .token_text import name_tokens

#: d_model up to which ``dense=None`` computes exactly (benchmarks/dense_threshold.py)
DENSE_AUTO_MAX_D = 1024
#: columns per batched JVP when J is formed
DENSE_CHUNK = 64
#: default eigensolver tolerance by operator precision (``tol=None``)
DEFAULT_TOL = {torch.float64: 1e-8, torch.float32: 1e-4}


#: Block operators cached at once (the latest used). Each holds float64 copies of its block's
#: weights (Llama-3-8B: 1.75 GB a layer; all 32 kept made the jacobian section peak at 75 GiB
#: on an H200): a section applies one layer's at a time, the matrix-free bottleneck chain holds
#: its own references. A rebuild costs a weight copy and one batched forward.
OPERATORS_KEPT = 2


#: the fewest single-column applications the matrix-free section's Krylov runs took for one
#: block Jacobian (eigs of J and svds of J - I, k = 8-16) on the Llama-3.2-1B shape
#: (benchmarks/jacobian_cpu.py: 462-805): forming J costs d_model columns at COLUMN_COST
SECTION_KRYLOV_MIN = 450


def resolve_materialize(choice: bool | None, d: int, device: Union[str, torch.device]) -> bool:
    """Whether the matrix-free rows come from J's matrix (``JacobianOptions.materialize``):
    ``choice``, or (None) where an application costs FLOPs (``linalg.cost.flop_bound``: the
    CPU from d_model = CPU_FLOP_BOUND_N) and d columns in WIDTH-column products, at
    COLUMN_COST of a column alone each, cost less than SECTION_KRYLOV_MIN single columns
    (d_model < 3750). A fixed rule: the same call takes the same path on every run.

    >>> resolve_materialize(None, 2048, "cpu"), resolve_materialize(None, 2048, "cuda")
    (True, False)
    >>> resolve_materialize(None, 4096, "cpu"), resolve_materialize(None, 256, "cpu")
    (False, False)
    """
    if choice is not None:
        return bool(choice)
    return flop_bound(d, device) and d * COLUMN_COST < SECTION_KRYLOV_MIN


def resolve_dense(dense: bool | None, d: int) -> bool:
    """The computation ``dense`` asks for at width d: None -> d <= DENSE_AUTO_MAX_D.

    >>> resolve_dense(None, 384), resolve_dense(None, 4096), resolve_dense(False, 384)
    (True, False, False)
    """
    return d <= DENSE_AUTO_MAX_D if dense is None else bool(dense)


class JacobianView:
    """Per-layer block Jacobians of ``subject`` under ``options`` (computed on demand)."""

    subject: Subject
    options: JacobianOptions
    exact: bool
    method: str
    label: str
    tol: float
    materialize: bool

    def __init__(self, subject: Subject, options: JacobianOptions, *,
                 method: str = "auto") -> None:
        d = subject.anatomy.residual_width  # d_model, or streams x d_model (Gemma 3n)
        self.exact = resolve_dense(options.dense, d)
        if options.k >= d or (options.k > d - 2 and not self.exact):
            raise OptionError("jacobian.k", options.k, f"an int below d_model={d}" + (
                "" if self.exact else f", at most d_model - 2 = {d - 2} matrix-free"),
                hint="the exact computation (dense=True) reports every eigenvalue anyway")
        n = subject.recording.n_samples
        if n and not options.sample < n:
            raise OptionError("jacobian.sample", options.sample, f"a recorded batch row, 0..{n - 1}")
        self.subject, self.options = subject, options
        # "auto" traces each block's JVP once (torch.func.linearize), which pays off over many
        # matvecs; "jvp" (recompute the forward per batched JVP) suits a block whose J is
        # formed once and dropped (reinit_test's re-initialised models)
        self.method = method
        self.label = subject.label
        self.tol = options.tol if options.tol is not None else DEFAULT_TOL[torch.float64]
        device = self._device()
        self.materialize = not self.exact and resolve_materialize(
            options.materialize, d, device if device is not None else "cpu")

    def describe(self) -> dict[str, Any]:
        """The ``jacobian`` entry of the report metadata: which computation, and why."""
        o, d = self.options, self.subject.anatomy.residual_width
        out = {"computation": "exact" if self.exact else "matrix-free",
               "dense_option": o.dense, "dense_auto_max_d": DENSE_AUTO_MAX_D, "d_model": d,
               "tol": self.tol}
        if not self.exact:
            out["absent_columns"] = dict(MATRIX_FREE_ABSENT)
            out["materialized"] = self.materialize
            out["materialized_why"] = self._materialize_why()
        if d > NULL_MC_MAX_D:
            out["top_k_null"] = (f"frac_complex_top{o.k}_null is NaN: its Monte Carlo null is "
                                 f"computed on demand only for d <= {NULL_MC_MAX_D}")
        routed = [p.index for p in self.subject.anatomy.layers if (p.mlp or "").startswith("routed")]
        if routed:
            out["routing"] = (
                f"layers {routed} route tokens to experts: the replay recomputes the router at "
                "the recorded input (in the replay dtype) and differentiates the mixing weights "
                "with the top-k choice held fixed: the recorded forward's (the block rerun in "
                "the model's own dtype); where the replay's own choice would differ (a near-tie) "
                "the recorded one is held and fallbacks say so (linearize.routing_held)")
        replays = [p.index for p in self.subject.anatomy.layers if not p.kv_cache_only]
        if replays:
            out["full_sequence_layers"] = (
                f"layers {replays} carry earlier tokens in a recurrent state or convolution "
                "window: each product replays their whole sequence (no single-query replay)")
        return out

    def _materialize_why(self) -> str:
        o, d = self.options, self.subject.anatomy.residual_width
        how = ("each block's J is formed from d_model columns in {w}-column products, eigs and "
               "svds iterate on it (every eigenpair and singular triplet checked with fresh "
               "products of the operator) and the Hutchinson probes are applied to it: the "
               "same values as on the operator, to tol").format(w=WIDTH)
        if o.materialize is not None:
            return (how if self.materialize else "the operator itself (Krylov)") + \
                f" (jacobian.materialize={o.materialize})"
        if self.materialize:
            return (f"{how}. Chosen by the cost rule: on the CPU from d_model = "
                    f"{CPU_FLOP_BOUND_N} an application costs FLOPs, and a column in a "
                    f"{WIDTH}-column product ~{COLUMN_COST} of one alone: d_model = {d} "
                    f"columns cost ~{d * COLUMN_COST:.0f} single ones, less than the "
                    f"{SECTION_KRYLOV_MIN} the Krylov runs take (jacobian.materialize=False "
                    "iterates on the operator)")
        return ("Krylov on the operator: " + ("an application costs dispatch here, not FLOPs"
                if not flop_bound(d, self._device() or "cpu") else
                f"d_model = {d} columns would cost ~{d * COLUMN_COST:.0f} single ones, more "
                f"than the {SECTION_KRYLOV_MIN} the Krylov runs take") +
                " (jacobian.materialize=True forms J)")

    def _device(self) -> torch.device | None:
        """Where the blocks are replayed (the recorded input's device), or None when no
        replayable input was recorded (building the operators says why)."""
        if not self.subject.layers:
            return None
        try:
            return self.subject.recording.block_input(self.subject.layers[0],
                                                      self.options.sample).hidden.device
        except RecordingError:
            return None

    @property
    def layers(self) -> tuple[int, ...]:
        """The layers analysed: the recorded ones (this rank's share when distributed)."""
        return self.subject.layers

    def positions(self) -> list[int]:
        """The recording rows the options' ``positions`` resolve to for the analysed sample
        (-1: the last real token).
        """
        return self.subject.positions(self.options.positions, self.options.sample)

    def bar(self, items: Iterable[Any], desc: str) -> Iterable[Any]:
        """Iterate ``items`` (layers), one step of this view's anchor Jacobians
        (:attr:`anchor_work`) on the analysis' progress display per layer."""
        return progress.layers(items, f"{desc} ({self.label})", work=self.anchor_work)

    @property
    def anchor_work(self) -> str:
        """The progress pool of the dense Jacobians at the default position
        (``progress_plan``)."""
        return f"anchor:{self.label}"

    @property
    def gain_work(self) -> str:
        """The progress pool of the per-unit gains at the default position: the dense
        Jacobians where they come from them, else the matrix-free estimates."""
        return self.anchor_work if self.exact or self.dense_products else f"gain:{self.label}"

    def metric_steps(self, items: Iterable[tuple[int, int]]) -> Iterable[tuple[int, int]]:
        """Iterate (layer, position) pairs, one step of this view's Jacobian metrics on the
        progress display after each."""
        several = len(self.positions()) > 1
        return progress.each(items, lambda item: f"Jacobian spectra ({self.label}) layer "
                             f"{item[0]}" + (f" position {item[1]}" if several else ""),
                             work=f"jacobian:{self.label}")

    def _memo(self, key: tuple, compute):
        return self.subject.memo(("jacobian", self.options.sample) + key, compute)

    def operator(self, layer: int, position: int) -> BlockJacobian:
        """Block ``layer``'s Jacobian operator; the OPERATORS_KEPT latest are cached (each holds
        float64 copies of its block's weights), others rebuilt on demand."""
        s = self.subject
        return s.working(("jacobian", self.options.sample, "operator", layer, position,
                          self.method), lambda: block_jacobian(
            s.anatomy, s.recording, layer, position=position, sample=self.options.sample,
            method=self.method), keep=OPERATORS_KEPT)

    def dense(self, layer: int, position: int) -> Tensor:
        """The full J: d batched JVPs of the block operator (single-query where it applies),
        DENSE_CHUNK columns at a time (a full-sequence JVP holds [columns, L, d] activations)."""
        def compute() -> Tensor:
            op = self.operator(layer, position)
            d = op.shape[1]
            eye = torch.eye(d, dtype=op.dtype, device=op.device)
            return torch.cat([op.matmat(eye[:, i:i + DENSE_CHUNK])
                              for i in range(0, d, DENSE_CHUNK)], dim=1).to(torch.float64)
        return self._memo(("dense", layer, position), compute)

    def _metrics_key(self, layer: int, position: int) -> tuple:
        o = self.options
        return ("metrics", layer, position, o.k, self.exact, o.n_samples, o.seed, self.tol,
                self.materialize)

    def layers_together(self) -> bool:
        """Whether :meth:`table` computes the layers in groups (:meth:`groups`):
        ``group_layers`` where given, else (None) unless an application of the operators costs
        FLOPs rather than dispatch (``linalg.cost.flop_bound`` of d_model on the device the
        blocks are replayed on: the CPU from ``CPU_FLOP_BOUND_N``, where a group's batched
        products and the block svds' extra columns cost their FLOPs and save nothing), and
        never where the layers' matrices are formed (:attr:`materialize`)."""
        choice = self.options.group_layers
        if choice is not None or not self.layers or self.materialize:
            return bool(choice)
        device = self._device()
        return device is not None and not flop_bound(self.subject.anatomy.residual_width, device)

    def groups(self, position: int) -> list[list[BlockJacobian]]:
        """Every layer's operator at ``position``, in layer groups that run together
        (``linearize.group``: one pass of the traced graph serves a whole group; at most
        ``group_capacity`` layers a group, by free memory); a layer that cannot join a group
        (another block structure, no split single-query replay) is a group of one. The
        operators are built here and held by their group only."""
        s, o = self.subject, self.options
        layers = list(self.layers)
        groups: list[BlockGroup] = []
        alone: list[list[BlockJacobian]] = []
        cap = 0
        for layer in layers:
            op = block_jacobian(s.anatomy, s.recording, layer, position=position,
                                sample=o.sample, method=self.method)
            if not cap:
                cap = group_capacity(op, len(layers))
            if any(g.add(op) for g in groups if g.size < cap):
                continue
            try:
                groups.append(BlockGroup([op], capacity=cap))
            except TypeError:  # not a split single-query operator: it runs on its own
                alone.append([op])
        out: list[list[BlockJacobian]] = []
        for g in groups:
            members: list[BlockJacobian] = list(g.seal().members()) if g.size > 1 else list(g.ops)
            out.append(members)
        return out + alone

    def _grouped(self, position: int) -> None:
        """Every layer's metrics at ``position``, computed group by group (see
        :meth:`groups`) and memoised as :meth:`metrics` would be."""
        o = self.options
        self._memo(("grouped", position, o.k, self.exact, o.n_samples, o.seed, self.tol,
                    self.materialize),
                   lambda: self._compute_grouped(position) or True)

    def _compute_grouped(self, position: int) -> None:
        o = self.options
        for ops in self.groups(position):
            if self.exact:
                dense = self._dense_all(ops, position)
                ms = [replace(jacobian_metrics(J, k=o.k, dense=True, seed=o.seed),
                              n_matvecs=J.shape[0]) for J in dense]
            elif len(ops) > 1:
                ms = jacobian_metrics_batch(ops, k=o.k, n_samples=o.n_samples, seed=o.seed,
                                            tol=self.tol)
            else:
                ms = [self._matrix_free(ops[0])]
            for op, m in zip(ops, ms):
                self._memo(self._metrics_key(op.layer, position), lambda m=m: m)
                self._memo(("row_position", op.layer, position), lambda op=op: int(op.positions[0]))
            for _ in self.metric_steps([(op.layer, position) for op in ops]):
                pass

    def _dense_all(self, ops: list[BlockJacobian], position: int) -> list[Tensor]:
        """The full J of every operator, DENSE_CHUNK columns a pass for all of them together
        (memoised per layer as :meth:`dense` is)."""
        d = ops[0].shape[1]
        eye = torch.eye(d, dtype=ops[0].dtype, device=ops[0].device)
        cols = [apply_all(ops, eye[:, i:i + DENSE_CHUNK].expand(len(ops), d, -1))
                for i in range(0, d, DENSE_CHUNK)]
        full = torch.cat(cols, dim=2)
        return [self._memo(("dense", op.layer, position), lambda J=J: J)
                for op, J in zip(ops, full)]

    def metrics(self, layer: int, position: int) -> JacobianMetrics:
        """The :class:`~spectral_hooks.metrics.jacobian.JacobianMetrics` of block ``layer`` at
        ``position``: from the dense J when exact, else matrix-free; computed once per state.
        """
        o = self.options

        def compute() -> JacobianMetrics:
            if not self.exact:
                return self._matrix_free(self.operator(layer, position))
            J = self.dense(layer, position)  # formed once, shared with other sections
            return replace(jacobian_metrics(J, k=o.k, dense=True, seed=o.seed),
                           n_matvecs=J.shape[0])
        return self._memo(self._metrics_key(layer, position), compute)

    def _matrix_free(self, op: BlockJacobian) -> JacobianMetrics:
        """One operator's matrix-free metrics (from its matrix where :attr:`materialize`);
        the top-k singular values of J, which no column reads, are skipped."""
        o = self.options
        return jacobian_metrics(op, k=o.k, dense=False, n_samples=o.n_samples, seed=o.seed,
                                tol=self.tol, materialize=self.materialize,
                                singular_values=False)

    def row_position(self, layer: int, position: int) -> int:
        """The recording row a position spec resolves to (-1: the last real token)."""
        return self._memo(("row_position", layer, position),
                          lambda: int(self.operator(layer, position).positions[0]))

    def table(self) -> pd.DataFrame:
        """The ``jacobian`` table of this view: one row per (layer, position) with the metrics
        of METRICS.md ("Jacobian view"), its ``variant`` (the subject's label) and ``sample``.
        """
        def compute() -> pd.DataFrame:
            rows = []
            if self.layers_together():
                for p in self.positions():
                    self._grouped(p)
            items = [(l, p) for l in self.layers for p in self.positions()]
            for layer, position in self.metric_steps(items):
                row = jacobian_row(self.metrics(layer, position), layer=layer,
                                   position=self.row_position(layer, position))
                rows.append({"variant": self.label, **row, "sample": self.options.sample})
            return pd.DataFrame(rows)
        o = self.options
        return self._memo(("table", o.positions, o.k, self.exact, o.n_samples, o.seed,
                           self.tol, self.materialize), compute)

    def eigen_table(self) -> pd.DataFrame:
        """The eigenvalues behind :meth:`table`: one row per (layer, position, eigenvalue)
        with ``real``, ``imag`` and ``abs``.
        """
        rows = []
        if self.layers_together():  # the same computation as table(), whichever is read first
            for p in self.positions():
                self._grouped(p)
        items = [(layer, position) for layer in self.layers for position in self.positions()]
        for layer, position in self.metric_steps(items):
            rows += eigen_rows(self.metrics(layer, position), layer=layer,
                               position=self.row_position(layer, position))
        return pd.DataFrame(rows)

    @property
    def anchor(self) -> int:
        """The row of the chain, bottleneck and amplification: the anatomy's default position
        (the last real token of a text model, a vision tower's CLS token)."""
        return self.subject.anatomy.default_position

    def chain(self) -> list[LinearOperator]:
        """Token Jacobians of every recorded layer in order at the default position."""
        layers = list(self.layers)
        if layers != list(range(layers[0], layers[-1] + 1)):
            raise RecordingError(f"the bottleneck needs consecutive recorded layers, got "
                                 f"{layers}: instrument with layers=None")
        return [self.operator(layer, self.anchor) for layer in progress.layers(
            layers, f"Jacobian operators ({self.label})", work=f"operators:{self.label}")]

    @property
    def dense_products(self) -> bool:
        """Exact (all d singular values) bottleneck products: the default up to SCHUR_MAX_D,
        so that every variant, schur included, is ranked from the same full spectrum."""
        choice = self.options.bottleneck_dense
        return self.subject.anatomy.residual_width <= SCHUR_MAX_D if choice is None else choice

    def end_to_end(self, dense: bool) -> list[Any]:
        """P_1..P_L at the default position through the whole stack (bidirectional models)."""
        s, o = self.subject, self.options
        if dense:
            P = self._memo(("end_to_end",), lambda: end_to_end_jacobians(
                s.anatomy, s.recording, layers=self.layers, sample=o.sample, position=self.anchor))
            return list(P)
        return end_to_end_operators(s.anatomy, s.recording, layers=self.layers,
                                    sample=o.sample, position=self.anchor)

    def dense_chain(self) -> list[Tensor]:
        """The dense J_l of every analysed layer at the default position, in layer order
        (computed once: every variant of the bottleneck reads it, and the progress display
        shows its layers once)."""
        return self._memo(("dense_chain", self.anchor), lambda: [
            self.dense(layer, self.anchor) for layer in self.bar(self.layers, "dense Jacobians")])

    def amplification(self, layer: int) -> UnitNorms:
        """Per-unit amplification of J - I of block ``layer`` at the default position (exact
        from the dense J where the products are dense, else a matrix-free estimate with its
        standard error).
        """
        o = self.options
        if self.exact or self.dense_products:
            J = self.dense(layer, self.anchor)
            eye = torch.eye(J.shape[0], dtype=J.dtype, device=J.device)
            return amplification(J - eye, dense=True)
        J: Union[LinearOperator, Tensor] = self.operator(layer, self.anchor)
        delta = J - IdentityOperator(J.shape[0], dtype=J.dtype, device=J.device)
        return amplification(delta, n_samples=o.n_samples, seed=o.seed)

    def log_gain(self, layer: int) -> UnitNorms:
        """Signed per-unit gain log ||J e_i|| of the whole block (identity included), exact or
        estimated as :meth:`amplification` is."""
        o = self.options
        if self.exact or self.dense_products:
            return log_gain(self.dense(layer, self.anchor), dense=True)
        return log_gain(self.operator(layer, self.anchor), n_samples=o.n_samples, seed=o.seed)


def sample_rows(subject: Subject, o: JacobianOptions) -> list[int]:
    """The batch rows the jacobian table linearises: ``o.sample``, or ``o.samples``."""
    if o.samples is None:
        return [o.sample]
    n = subject.recording.n_samples
    rows = list(range(n)) if o.samples == "all" else [int(r) for r in o.samples]
    bad = [r for r in rows if not r < n]
    if bad:
        raise OptionError("jacobian.samples", list(o.samples), f"recorded batch rows, 0..{n - 1}")
    return rows


def _views(subject: Subject, o: JacobianOptions) -> list[JacobianView]:
    return [JacobianView(subject, replace(o, sample=r, samples=None))
            for r in sample_rows(subject, o)]


def jacobian_section(subject: Subject, options: AnalyzeOptions,
                     init: Subject | None = None) -> pd.DataFrame:
    """One row per (variant, sample, layer, position); ``init`` adds the re-initialised model's
    rows."""
    o = options.jacobian_options
    frames = [view.table() for view in _views(subject, o)]
    if init is not None:
        frames += [view.table() for view in _views(init, o)]
    tokenizer = options.tokenizer if options.tokenizer is not None \
        else subject.anatomy.tokenizer
    return name_tokens(pd.concat(frames, ignore_index=True), subject.recording.token_ids,
                       tokenizer)


#: jacobian-table columns that are not metrics (identifiers, counts, flags)
_NOT_METRICS = {"layer", "position", "sample", "token_id", "n_matvecs", "k", "n_eigenvalues",
                "d"}


def jacobian_summary(table: pd.DataFrame) -> pd.DataFrame:
    """``jacobian_summary``: per variant, layer and metric of the jacobian table, the mean over
    its samples and positions and the spread across samples (``metrics.stats.sample_summary``).
    Metrics: the float columns, standard errors (``*_se``) left out."""
    metrics = [c for c in table.columns if c not in _NOT_METRICS and not c.endswith("_se")
               and pd.api.types.is_float_dtype(table[c])]
    return sample_summary(table, metrics)
