"""The kind of the block each row of a section names: ``mixer`` and ``mlp`` columns, read off the
anatomy (``anatomy.layers[layer].mixer`` / ``.mlp``, see :mod:`spectral_hooks.anatomy.mixers`).

    >>> import pandas as pd
    >>> from transformers import GPT2Config, GPT2Model
    >>> from spectral_hooks import anatomy_of
    >>> from spectral_hooks.analysis.columns import SCHEMAS
    >>> anatomy = anatomy_of(GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)))
    >>> table = pd.DataFrame({"layer": [1, 0], "gap_ratio": [0.5, 0.25]})
    >>> out = with_layer_kinds(table, anatomy, SCHEMAS["power"])
    >>> out.columns.tolist(), out["mixer"].tolist()
    (['layer', 'mixer', 'mlp', 'gap_ratio'], ['mha', 'mha'])

``analysis.analyze`` attaches them to every section whose schema declares them
(``columns.LAYER_KINDS``), once, as the section is computed; the training logger's power rows
take them the same way. Each column is categorical over the fixed kinds of ``anatomy.mixers``
(``MIXERS``, ``MLPS``), so tables of different models concatenate and save with one set of
categories.
"""

from __future__ import annotations

import weakref

import numpy as np
import pandas as pd

from ..anatomy import Anatomy
from ..report.schema import Column, SectionSchema
from .columns import LAYER_KINDS

__all__ = ["with_layer_kinds"]


def with_layer_kinds(table: pd.DataFrame, anatomy: Anatomy, schema: SectionSchema
                     ) -> pd.DataFrame:
    """``table`` with the :data:`~.columns.LAYER_KINDS` its ``schema`` declares inserted right
    after ``layer`` (a new frame; ``table`` is left as it is; the same frame again for the same
    live table). Unchanged when the schema declares none, or the table has no ``layer`` column
    or already has them."""
    kinds = [column for column in LAYER_KINDS if column in schema.columns]
    if not kinds or "layer" not in table.columns or \
            any(column.name in table.columns for column in kinds):
        return table
    key = (id(table), schema.name)
    done = _DONE.get(key)
    if done is None:
        done = _DONE[key] = _inserted(table, anatomy, kinds)
        weakref.finalize(table, _DONE.pop, key, None)  # kept as long as the table lives
    return done


#: the labelled frame of each live table (by id and section): a section that the analysis
#: cache returns again (``probe.analyze().power is probe.analyze().power``) keeps its identity
_DONE: dict[tuple[int, str], pd.DataFrame] = {}


def _inserted(table: pd.DataFrame, anatomy: Anatomy, kinds: list[Column]) -> pd.DataFrame:
    rows = table["layer"].to_numpy(dtype=np.int64)
    out = table.copy(deep=False)
    at = list(table.columns).index("layer") + 1
    for offset, column in enumerate(kinds):
        per_layer = pd.Categorical([getattr(part, column.name) for part in anatomy.layers],
                                   categories=list(column.categories or ()))
        out.insert(at + offset, column.name, per_layer.take(rows))
    return out
