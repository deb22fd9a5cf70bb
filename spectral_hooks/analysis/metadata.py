"""What a report says about its run: model, inputs, resolved options, versions, timings,
fallbacks taken.

    >>> config_hash(None) is None
    True
"""

from __future__ import annotations

import hashlib
import platform
from typing import Any, Optional

import torch

from .._version import __version__
from .options import AnalyzeOptions
from .subject import Subject


def versions() -> dict[str, Any]:
    import transformers

    return {"spectral_hooks": __version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


def config_hash(config: Any) -> Optional[str]:
    if config is None:
        return None
    text = config.to_json_string() if hasattr(config, "to_json_string") else repr(config)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def metadata(subject: Subject, options: AnalyzeOptions) -> dict[str, Any]:
    """The metadata dict of a new report (``timings_s`` and ``fallbacks`` fill in as sections
    are computed)."""
    anatomy, rec = subject.anatomy, subject.recording
    n_tokens = int(rec.mask.sum()) if subject.keeps_tokens else None
    return {
        "model": type(anatomy.model).__name__,
        "family": anatomy.family,
        **({"stack": anatomy.stack} if anatomy.stack is not None else {}),
        "name_or_path": getattr(anatomy.config, "_name_or_path", None) or None,
        "config_hash": config_hash(anatomy.config),
        "n_layers": anatomy.n_layers, "d_model": anatomy.d_model,
        "n_heads": anatomy.n_heads, "n_kv_heads": anatomy.n_kv_heads,
        "causal": anatomy.causal, "norm_placement": anatomy.norm_placement,
        "inputs": {"n_sequences": rec.n_samples, "n_tokens": n_tokens,
                   "n_forward_calls": rec.n_calls, "store": rec.store},
        "options": options.to_dict(),
        "versions": versions(),
        "timings_s": {},
        "fallbacks": [],
    }
