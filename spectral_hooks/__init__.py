"""spectral_hooks: spectral metrics of transformer layers, recorded with forward hooks.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2Model
    >>> import spectral_hooks as sh
    >>> model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4)).eval()  # or any HF model
    >>> probe = sh.instrument(model)                   # forward hooks on every block
    >>> with torch.no_grad():
    ...     _ = model(input_ids=torch.arange(16).reshape(2, 8))
    >>> report = probe.analyze()                       # per-layer tables (pandas)
    >>> report.power["layer"].tolist()
    [0, 1]
    >>> probe.remove()                                 # the model is as it was

The public names load on first use (PEP 562), so ``import spectral_hooks`` and the
``spectral-hooks`` command's ``--help`` do not pay for torch, transformers and the analysis
modules until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:  # the same names, eagerly, for type checkers and editors
    from . import linalg
    from .analysis import (
                           AnalyzeOptions,
                           IdealisedOptions,
                           JacobianOptions,
                           PowerOptions,
                           TopologyOptions,
    )
    from .anatomy import Anatomy, EncoderDecoderAnatomy, LayerParts, anatomy_of, register_anatomy
    from .anatomy.weights import layer_biases, layer_matrices
    from .encoder_decoder import EncoderDecoderProbe
    from .linalg import eigs, svds
    from .probe import Probe, instrument
    from .recording import Recording
    from .report import Report
    from .steering import Steering, steer

__all__ = ["AnalyzeOptions", "IdealisedOptions", "JacobianOptions", "PowerOptions",
           "TopologyOptions", "Anatomy",
           "EncoderDecoderAnatomy", "EncoderDecoderProbe", "LayerParts", "Probe", "Recording",
           "Report", "Steering", "anatomy_of", "eigs", "instrument", "layer_biases",
           "layer_matrices", "linalg", "register_anatomy",
           "steer", "svds", "__version__"]

# public name -> the submodule that defines it (None: the name is the submodule itself)
_LAZY = {
    "AnalyzeOptions": ".analysis", "IdealisedOptions": ".analysis",
    "JacobianOptions": ".analysis", "PowerOptions": ".analysis", "TopologyOptions": ".analysis",
    "Anatomy": ".anatomy", "EncoderDecoderAnatomy": ".anatomy", "LayerParts": ".anatomy",
    "anatomy_of": ".anatomy", "register_anatomy": ".anatomy",
    "EncoderDecoderProbe": ".encoder_decoder",
    "linalg": None, "eigs": ".linalg", "svds": ".linalg",
    "Probe": ".probe", "instrument": ".probe",
    "Recording": ".recording", "Report": ".report",
    "Steering": ".steering", "steer": ".steering",
    "layer_biases": ".anatomy.weights", "layer_matrices": ".anatomy.weights",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name, "")
    if where == "":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if where is None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
