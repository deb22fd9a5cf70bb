"""spectral_hooks: spectral metrics of transformer layers, recorded with forward hooks."""

__version__ = "0.1.0"
