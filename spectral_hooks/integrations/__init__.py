"""Integrations with training loops and infrastructure; they call the public API only.

    loggers      MetricsLogger, TensorBoardLogger, WandbLogger, JSONLLogger, CSVLogger,
                 flatten_power (report -> {"spectral/layer_03/gap_ratio": ...})
    hf_trainer   SpectralCallback (transformers.TrainerCallback; .attach(trainer) for report_to)
    lightning    SpectralLightningCallback (the 'lightning' extra)
    tracker      SpectralTracker (plain loops: tracker.step(step))
    distributed  all_reduce_stats (store="stats" recordings combined across ranks)

Optional dependencies are imported on first use.
"""

from __future__ import annotations

from typing import Any

from .loggers import (
    POWER_COLUMNS,
    CSVLogger,
    JSONLLogger,
    MetricsLogger,
    TensorBoardLogger,
    TornLineWarning,
    WandbLogger,
    flatten_power,
)
from .tracker import SpectralTracker

_LAZY = {"SpectralCallback": "hf_trainer", "all_reduce_stats": "distributed",
         "SpectralLightningCallback": "lightning"}

__all__ = ["CSVLogger", "JSONLLogger", "MetricsLogger", "POWER_COLUMNS", "SpectralCallback",
           "SpectralLightningCallback", "SpectralTracker", "TensorBoardLogger",
           "TornLineWarning", "WandbLogger", "all_reduce_stats", "flatten_power"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
