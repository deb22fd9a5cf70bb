"""spectral_hooks: spectral metrics of transformer layers, recorded with forward hooks.

    >>> import spectral_hooks as sh
    >>> probe = sh.instrument(model)            # doctest: +SKIP
    >>> model(**batch); report = probe.analyze()  # doctest: +SKIP
"""

from . import linalg
from ._version import __version__
from .analysis import (
                       AnalyzeOptions,
                       IdealisedOptions,
                       JacobianOptions,
                       PowerOptions,
                       TopologyOptions,
)
from .anatomy import Anatomy, EncoderDecoderAnatomy, LayerParts, anatomy_of, register_anatomy
from .encoder_decoder import EncoderDecoderProbe
from .linalg import eigs, svds
from .probe import Probe, instrument
from .recording import Recording
from .report import Report
from .steering import Steering, steer
from .weights import layer_biases, layer_matrices

__all__ = ["AnalyzeOptions", "IdealisedOptions", "JacobianOptions", "PowerOptions",
           "TopologyOptions", "Anatomy",
           "EncoderDecoderAnatomy", "EncoderDecoderProbe", "LayerParts", "Probe", "Recording",
           "Report", "Steering", "anatomy_of", "eigs", "instrument", "layer_biases",
           "layer_matrices", "linalg", "register_anatomy",
           "steer", "svds", "__version__"]
