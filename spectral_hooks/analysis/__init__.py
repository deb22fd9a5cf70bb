"""From a recording to a report: one module per section, each ``(subject, options) -> DataFrame``.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()
    >>> with sh.instrument(model) as probe, torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> report = probe.analyze(jacobian={"k": 4})   # Subject + AnalyzeOptions -> analyze()
    >>> report.jacobian["layer"].tolist()            # computed now
    [0, 1]

``probe.analyze(...)`` is the front door: it builds the :class:`Subject` (anatomy, recording,
the probe's cache) and resolves the keywords into :class:`AnalyzeOptions`. This package calls
``linearize``, ``linalg`` and ``metrics`` directly and never the probe.

Sections (computed lazily, each once per state of the weights and recording):
power, cross_power (decoder stacks of encoder-decoder models), spectra, shared_weights (power
view); idealised (idealised=True); jacobian, trends (jacobian=...); bottleneck,
propagation (bottleneck=True); topology, units, communities (topology=True); reinit_test
(reinit_seeds=n).
"""

from __future__ import annotations

import time
from typing import Callable

import pandas as pd

from ..anatomy.sublayers import sublayer_split
from ..anatomy.wrappers import refuse_sharded
from ..errors import RecordingError, collecting_fallbacks
from ..report import Report
from ..report.metadata import ReportMetadata
from .bottleneck import bottleneck_section, propagation_section
from .cache import AnalysisCache
from .columns import SCHEMAS
from .idealised import check_idealised_request, idealised_section, idealised_unavailable
from .jacobian import JacobianView, jacobian_section, jacobian_summary, sample_rows
from .layer_kinds import with_layer_kinds
from .metadata import metadata
from .options import (
    AnalyzeOptions,
    IdealisedOptions,
    JacobianOptions,
    PowerOptions,
    TopologyOptions,
)
from .power import cross_power_section, has_cross_attention, power_section
from .preflight import TOKEN_COLUMNS, TokenColumnsWarning, preflight
from .progress import Progress
from .progress_plan import progress_plan
from .reinit import init_subject
from .reinit_comparison import reinit_test_section
from .shared_weights import shared_weights_section
from .spectra import spectra_section
from .subject import Subject
from .topology import communities_section, topology_section, units_section
from .trends import trends_section

__all__ = ["AnalyzeOptions", "IdealisedOptions", "JacobianOptions", "PowerOptions",
           "TopologyOptions", "AnalysisCache",
           "Subject", "analyze", "TOKEN_COLUMNS", "TokenColumnsWarning"]

Section = Callable[[], pd.DataFrame]


def _power_sections(subject: Subject, options: AnalyzeOptions, skipped: dict) -> dict:
    sections: dict[str, Section] = {
        "power": lambda: power_section(subject, options),
        "spectra": lambda: spectra_section(subject, options),
    }
    if has_cross_attention(subject):
        sections["cross_power"] = lambda: cross_power_section(subject, options)
    if subject.shared_groups():
        sections["shared_weights"] = lambda: shared_weights_section(subject, options)
    elif subject.anatomy.shared_groups:
        skipped["shared_weights"] = ("it needs resid_pre and resid_post of every application "
                                     "of a shared block (store='device' or 'cpu')")
    return sections


def _jacobian_sections(subject: Subject, options: AnalyzeOptions) -> dict:
    o = options.jacobian_options
    refuse_sharded(subject.model, "the Jacobian view")
    JacobianView(subject, o)  # validates k against d_model now, not when first read
    sections: dict[str, Section] = {}
    if options.jacobian is not None:
        init = (lambda: init_subject(subject, seed=o.init_seed)) if options.reinit else None
        sections["jacobian"] = lambda: jacobian_section(
            subject, options, init() if init is not None else None)
        if o.samples is not None:
            sample_rows(subject, o)  # refused now, not when the section is read
            sections["jacobian_summary"] = lambda: jacobian_summary(sections["jacobian"]())
        sections["trends"] = lambda: trends_section(subject, options)
        sections["jacobian_spectra"] = lambda: JacobianView(subject, o).eigen_table()
    if options.bottleneck:
        sections["bottleneck"] = lambda: bottleneck_section(subject, options)
        sections["propagation"] = lambda: propagation_section(subject, options)
    if options.topology:
        if options.topology_sublayers:
            sublayer_split(subject.anatomy)  # refused now, not when the section is read
        sections["topology"] = lambda: topology_section(subject, options)
        sections["units"] = lambda: units_section(subject, options)
        sections["communities"] = lambda: communities_section(subject, options)
    if options.reinit_seeds:
        sections["reinit_test"] = lambda: reinit_test_section(subject, options)
    return sections


def _merge_spectra(sections: dict) -> None:
    """The Jacobian's eigenvalue rows join F's in ``spectra`` (or form it without power)."""
    jacobian_rows = sections.pop("jacobian_spectra", None)
    if jacobian_rows is None:
        return
    power_rows = sections.get("spectra")
    if power_rows is None:
        sections["spectra"] = jacobian_rows
    else:
        sections["spectra"] = lambda: pd.concat([power_rows(), jacobian_rows()],
                                                ignore_index=True)


def _instrumented(name: str, compute: Section, meta: ReportMetadata, progress: Progress
                  ) -> Section:
    """Time a section, show its progress, record the fallbacks taken while it is computed."""
    def run() -> pd.DataFrame:
        start = time.perf_counter()
        with collecting_fallbacks(meta["fallbacks"]), progress.section(name):
            result = compute()
        meta["timings_s"][f"section:{name}"] = round(time.perf_counter() - start, 4)
        return result
    return run


def _with_kinds(name: str, compute: Section, subject: Subject) -> Section:
    """The one place a section's rows get their block's kinds (``mixer``, ``mlp``: see
    layer_kinds.py), where its schema declares them."""
    schema = SCHEMAS.get(name)
    if schema is None:
        return compute

    def run() -> pd.DataFrame:
        table = compute()
        return table if table is None else with_layer_kinds(table, subject.anatomy, schema)
    return run


def analyze(subject: Subject, options: AnalyzeOptions) -> Report:
    """A :class:`Report` whose sections are computed when first read."""
    if not subject.recording.steps:
        raise RecordingError("nothing recorded yet: run the model inside the probe first")
    nan_reason = preflight(subject.recording, options)
    if subject.anatomy.verify is not None:  # the generic fallback, not yet checked
        raise RecordingError(f"the generic anatomy of {type(subject.model).__name__} is checked "
                             "on a recorded batch of at least two real tokens, and none was "
                             "recorded yet: run the model on one inside the probe first")
    meta = metadata(subject, options)
    if nan_reason is not None:
        meta = meta.replace(nan_reasons={"power": {"columns": list(TOKEN_COLUMNS),
                                                   "reason": nan_reason}})
    skipped: dict[str, str] = {}
    sections: dict[str, Section] = {}
    if options.power:
        sections.update(_power_sections(subject, options, skipped))
    if options.jacobian_view:
        sections.update(_jacobian_sections(subject, options))
        meta = meta.replace(jacobian=JacobianView(subject, options.jacobian_options).describe())
    if options.idealised:
        check_idealised_request(subject, options)
        reason = idealised_unavailable(subject)
        if reason is None:
            sections["idealised"] = lambda: idealised_section(subject, options)
        else:
            skipped["idealised"] = reason
    _merge_spectra(sections)
    if skipped:
        meta = meta.replace(sections_skipped=skipped)
    progress = Progress(*progress_plan(subject, options, list(sections)),
                        enabled=options.show_progress)
    return Report({name: _instrumented(name, _with_kinds(name, fn, subject), meta, progress)
                   for name, fn in sections.items()}, meta,
                  schemas={name: SCHEMAS[name] for name in sections if name in SCHEMAS})
