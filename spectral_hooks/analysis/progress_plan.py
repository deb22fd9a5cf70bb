"""The work an analysis will do, for its progress display: which pools of per-layer steps each
section computes and what a step is expected to cost (``progress.Work``), from the shapes alone.

    >>> import spectral_hooks as sh
    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> probe = sh.instrument(model)
    >>> with torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> sections, pools = progress_plan(probe.subject, AnalyzeOptions(), ["power", "spectra"])
    >>> sections["spectra"], pools["F"].units              # spectra shares power's eigs
    (['spectra', 'F'], 2)
    >>> pools["spectra"].cost < pools["F"].cost             # ... and its own table costs less
    True
    >>> probe.remove()

Costs are rough seconds on one CPU core: a dense eigen-decomposition of a d x d matrix
``EIG`` d^3 flops at ``EIG_RATE``; one application of a block's Jacobian (a JVP of c columns
at one position) ``APPLY`` d^2 c flops plus the attention over the T recorded positions at
``FLOP_RATE``, plus ``DISPATCH`` seconds of Python and kernel launches; building a block's
operator (tracing it) ``BUILD`` seconds; a matrix-free Jacobian takes about ``MATVECS_PER_K``
applications per eigenvalue asked for (k) plus its Hutchinson probes. They only set how far
each finished step moves the display (the share of the analysis done): the time left printed
is measured (each section's own rate), not taken from them.

Pools: ``F`` (the spectra of every F_t: power, spectra, trends share them), ``power`` (token
alignment of each layer), ``jacobian:<label>`` (the Jacobian metrics of the trained model, and
of the re-initialised one: one step per layer and position), ``anchor:<label>`` (the dense
Jacobians at the default position: the bottleneck's chain, the topology's gains), ``gain:<label>``
(matrix-free unit gains), ``operators:<label>`` (the block operators of the chain: matrix-free
bottleneck, propagation), ``sublayers``, ``bottleneck``, ``reinit_test`` and each section's own.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import SpectralHooksError
from .jacobian import JacobianView, sample_rows
from .options import AnalyzeOptions
from .progress import Work
from .subject import Subject

EIG = 20.0
EIG_RATE = 5e9
APPLY = 24.0
FLOP_RATE = 2e10
DISPATCH = 3e-3
BUILD = 0.2
MATVECS_PER_K = 100
#: a section whose own work is a table built from others'
TRIVIAL = 1e-3


def progress_plan(subject: Subject, options: AnalyzeOptions, sections: Sequence[str]
                  ) -> tuple[dict[str, list[str]], dict[str, Work]]:
    """(section -> pools it computes, pool -> Work) for the report's ``sections``."""
    L = max(1, len(subject.layers))
    d = subject.anatomy.residual_width
    rec = subject.recording
    try:
        T = int(rec.mask.shape[-1])
        N = int(rec.mask.sum())
    except SpectralHooksError:  # nothing recorded yet (analyze refuses it): a nominal size
        T, N = 64, 128
    eig = EIG * d ** 3 / EIG_RATE + DISPATCH

    def apply(columns: int) -> float:
        """One application of a block Jacobian to ``columns`` vectors (64 at a time)."""
        return ((APPLY * d * d + 4.0 * T * d) * columns / FLOP_RATE
                + DISPATCH * -(-columns // 64))
    pools: dict[str, Work] = {
        "F": Work(L, eig),
        "power": Work(L, 4.0 * N * d * min(N, d) / L / FLOP_RATE + DISPATCH),
    }
    plan: dict[str, list[str]] = {}
    labels = ["trained"] + (["init"] if options.reinit else [])
    if options.jacobian_view:
        o = options.jacobian_options
        view = JacobianView(subject, o)
        try:
            n_pos = len(view.positions())
            n_rows = len(sample_rows(subject, o))
        except SpectralHooksError:  # a bad position or sample: refused by its section, later
            n_pos = n_rows = 1
        dense_j = BUILD + apply(d)
        columns = MATVECS_PER_K * o.k + 2 * o.n_samples
        if view.exact:
            solve = dense_j + eig
        elif view.materialize:  # J formed from d columns, then the solvers on the matrix
            solve = dense_j + columns * 2.0 * d * d / FLOP_RATE
        else:
            solve = BUILD + columns * apply(1)
        dense = view.dense_products
        for label in labels:
            pools[f"jacobian:{label}"] = Work(L * n_pos * n_rows, solve)
            pools[f"anchor:{label}"] = Work(L, dense_j)
            pools[f"gain:{label}"] = Work(2 * L, BUILD + apply(2 * o.n_samples))
            pools[f"operators:{label}"] = Work(L, BUILD)
        variants = 1 + len(o.ablations) + (1 if options.reinit else 0)
        per_variant = (L * 12 * d ** 3 / EIG_RATE + (2 * L * L * d ** 3 / FLOP_RATE
                                                     if subject.anatomy.causal else 0)
                       if dense else 300 * L * apply(o.bottleneck_k))
        pools["bottleneck"] = Work(variants, per_variant)
        pools["sublayers"] = Work(2 * L * len(labels), BUILD + (
            apply(d) if view.exact or dense else apply(2 * o.n_samples)))
        pools["reinit_test"] = Work(L * (1 + options.reinit_seeds), dense_j + eig)
        gains = [f"anchor:{label}" if view.exact or dense else f"gain:{label}"
                 for label in labels]
        jacobians = [f"jacobian:{label}" for label in labels]
        topology = [*gains, *(["sublayers"] if options.topology_sublayers else [])]
        plan.update({
            "jacobian": ["jacobian", *jacobians],
            "jacobian_summary": ["jacobian_summary", *jacobians],
            "trends": ["trends", "jacobian:trained", "F", "power"],
            "bottleneck": ["bottleneck", *(f"anchor:{label}" if dense
                                           else f"operators:{label}" for label in labels)],
            "propagation": ["propagation", "operators:trained"],
            "topology": ["topology", *topology],
            "units": ["units", *topology],
            "communities": ["communities", *topology],
            "reinit_test": ["reinit_test"],
        })
        pools["propagation"] = Work(L, apply(1))
        pools["communities"] = Work(1, 1000.0 * L * d / 1e8)
        pools["topology"] = Work(L, 50.0 * d * d / FLOP_RATE + DISPATCH)
    plan.update({
        "power": ["power", "F"],
        "spectra": ["spectra", "F", *(["jacobian:trained"] if options.jacobian_view else [])],
        "cross_power": ["cross_power"],
        "shared_weights": ["shared_weights"],
        "idealised": ["idealised"],
    })
    pools.setdefault("cross_power", Work(L, eig))
    pools.setdefault("idealised", Work(L, eig / 4))
    pools.setdefault("shared_weights", Work(1, TRIVIAL))
    sections_plan = {name: plan.get(name, [name]) for name in sections}
    for names in sections_plan.values():
        for name in names:
            pools.setdefault(name, Work(1, TRIVIAL))
    used = {name for names in sections_plan.values() for name in names}
    return sections_plan, {name: work for name, work in pools.items() if name in used}
