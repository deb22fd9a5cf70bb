"""What a report says about its run: model, inputs, resolved options, versions, timings,
fallbacks taken, as a :class:`~spectral_hooks.report.metadata.ReportMetadata`.

    >>> config_hash(None) is None
    True
    >>> sorted(versions())
    ['python', 'torch', 'transformers']
"""

from __future__ import annotations

import hashlib
import platform
from typing import Any, Optional

import torch

from .._version import __version__
from ..report.metadata import ReportMetadata
from .options import AnalyzeOptions
from .subject import Subject


def versions() -> dict[str, Any]:
    """The versions of the libraries an analysis ran on (spectral_hooks' own is
    ``ReportMetadata.spectral_hooks_version``)."""
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def config_hash(config: Any) -> Optional[str]:
    """16 hex digits of the SHA-256 of a model config's JSON (of its repr without
    ``to_json_string``), or None without a config.

    >>> from transformers import GPT2Config
    >>> len(config_hash(GPT2Config()))
    16
    """
    if config is None:
        return None
    text = config.to_json_string() if hasattr(config, "to_json_string") else repr(config)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def metadata(subject: Subject, options: AnalyzeOptions) -> ReportMetadata:
    """The metadata of a new report (``timings_s`` and ``fallbacks`` fill in as sections are
    computed)."""
    anatomy, rec = subject.anatomy, subject.recording
    n_tokens = int(rec.mask.sum()) if subject.keeps_tokens else None
    return ReportMetadata(
        model=type(anatomy.model).__name__,
        family=anatomy.family,
        stack=anatomy.stack,
        name_or_path=getattr(anatomy.config, "_name_or_path", None) or None,
        config_hash=config_hash(anatomy.config),
        n_layers=anatomy.n_layers, d_model=anatomy.d_model,
        n_heads=anatomy.n_heads, n_kv_heads=anatomy.n_kv_heads,
        causal=anatomy.causal, norm_placement=anatomy.norm_placement,
        layer_mixers=[part.mixer for part in anatomy.layers],
        layer_mlps=[part.mlp for part in anatomy.layers],
        power_coverage=anatomy.power_coverage(subject.layers) if options.power else None,
        inputs={"n_sequences": rec.n_samples, "n_tokens": n_tokens,
                "n_forward_calls": rec.n_calls, "store": rec.store},
        options=options.to_dict(),
        spectral_hooks_version=__version__,
        versions=versions(),
        timings_s={},
        fallbacks=[],
    )
