"""Section ``reinit_test``: the trained model against ``reinit_seeds`` re-initialisations.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> probe = sh.instrument(model)
    >>> with torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> table = probe.analyze(reinit_seeds=2).reinit_test   # use >= 20 seeds for p < 0.05
    >>> table.groupby("metric", sort=False)["n_init"].first().to_dict()
    {'sym_energy': 2, 'commutator': 2, 'departure_rel': 2, 'erank_end_to_end': 2}
    >>> probe.remove()

Per layer, at the default position (the row of the bottleneck and the topology), the block
Jacobian's ``sym_energy``, its non-normality (``commutator`` and ``departure_rel``) and the
effective rank of the end-to-end Jacobian through the layer (``erank_end_to_end``: the
bottleneck's ``erank`` at depth = layer position + 1) of the trained model, against the same
values in models re-initialised with seeds ``jacobian.init_seed + i``, i < reinit_seeds, on the
same inputs (metrics/reinit_comparison.py computes the table). Exact (dense J, full spectra)
where the Jacobian view is (``jacobian.dense``), and the bottleneck exact up to SCHUR_MAX_D
(``jacobian.bottleneck_dense``); column ``dense`` says which. One init model is held at a time.
"""

from __future__ import annotations

import pandas as pd

from ..metrics.reinit_comparison import seed_test_table
from . import progress
from .bottleneck import variant_table
from .jacobian import JacobianView
from .options import AnalyzeOptions
from .reinit import transient_init_subject
from .subject import Subject

METRICS = ("sym_energy", "commutator", "departure_rel", "erank_end_to_end")


def _nan_if_none(value) -> float:
    return float("nan") if value is None else float(value)


def metric_values(view: JacobianView, label: str) -> pd.DataFrame:
    """Long table ``metric, layer, value`` of the tested metrics of one subject."""
    rows = []
    for layer in progress.layers(view.layers, label):
        m = view.metrics(layer, view.anchor)
        rows += [dict(metric=name, layer=layer, value=_nan_if_none(getattr(m, name)))
                 for name in METRICS[:3]]
    with progress.muted():  # this subject's steps are the layers above (one per layer)
        bottleneck = variant_table(view, "trained")
    for depth, erank in zip(bottleneck["depth"], bottleneck["erank"]):
        rows.append(dict(metric="erank_end_to_end", layer=view.layers[int(depth) - 1],
                         value=float(erank)))
    order = {name: i for i, name in enumerate(METRICS)}
    table = pd.DataFrame(rows)
    table = table.iloc[sorted(range(len(table)), key=lambda i: (order[table["metric"].iat[i]],
                                                                table["layer"].iat[i]))]
    return table.reset_index(drop=True)


def init_seeds(options: AnalyzeOptions) -> list[int]:
    """The re-initialisation seeds: ``jacobian.init_seed + i`` for i < ``reinit_seeds``."""
    o = options.jacobian_options
    return [o.init_seed + i for i in range(options.reinit_seeds)]


def reinit_test_section(subject: Subject, options: AnalyzeOptions) -> pd.DataFrame:
    """The ``reinit_test`` table: per metric and layer, the trained value against the
    re-initialised models' (:func:`~spectral_hooks.metrics.reinit_comparison.seed_test_table`), with a
    ``dense`` column saying which values are exact. Memoised on ``subject``."""
    o = options.jacobian_options

    def compute() -> pd.DataFrame:
        view = JacobianView(subject, o)
        trained = metric_values(view, "trained")
        frames = []
        for seed in init_seeds(options):
            init = JacobianView(transient_init_subject(subject, seed=seed), o, method="jvp")
            frames.append(metric_values(init, f"init seed {seed}").assign(seed=seed))
            del init  # one re-initialised model in memory at a time
        table = seed_test_table(trained, pd.concat(frames, ignore_index=True))
        bottleneck_dense = view.dense_products
        table["dense"] = [bottleneck_dense if m == "erank_end_to_end" else view.exact
                          for m in table["metric"]]
        return table
    return subject.memo(("reinit_test", o, options.reinit_seeds), compute)

