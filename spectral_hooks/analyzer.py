"""Analyzer: lazy, cached metrics of an instrumented model, returned as a :class:`Report`.

    >>> with instrument(model) as probe:              # doctest: +SKIP
    ...     model(**batch)
    >>> report = probe.analyze(power=True)            # nothing computed yet
    >>> report.power[["layer", "gap_ratio", "lift"]]  # computed now, then cached

Each section is a zero-argument function handed to the Report: it runs on first access only.
Results are cached by (weights version, recording state, options), so asking twice is free and
editing weights (steering, a training step) invalidates exactly what depends on them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import time
from typing import Any, Callable, Optional

import pandas as pd
import torch

from .metrics.power import power_table, spectra_table
from .metrics.shared_weights import shared_weight_table
from .report import Report
from .weights import layer_matrices

log = logging.getLogger(__name__)


def _versions() -> dict:
    import transformers

    from . import __version__

    return {"spectral_hooks": __version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


def config_hash(config: Any) -> Optional[str]:
    if config is None:
        return None
    text = config.to_json_string() if hasattr(config, "to_json_string") else repr(config)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Analyzer:
    """Computes report sections for one probe; see :meth:`analyze`."""

    def __init__(self, probe) -> None:
        self.probe = probe
        self._cache: dict = {}
        self.timings: dict = {}

    # ------------------------------------------------------------------ cache keys
    def _weights_version(self) -> tuple:
        """Changes when any weight changes: ``_version`` misses in-place updates that bypass
        autograd's counter (fused optimizers, writes through ``.data``), so every parameter's
        float64 sum and norm are part of the key (one pass over the weights, no copies)."""
        with torch.no_grad():
            return tuple((p.data_ptr(), p._version, float(p.sum(dtype=torch.float64)),
                          float(torch.linalg.vector_norm(p, dtype=torch.float64)))
                         for p in self.probe.model.parameters())

    def invalidate(self) -> None:
        """Forget every cached result."""
        self._cache.clear()

    def _recording_version(self) -> tuple:
        return (id(self.probe.recording), self.probe.recording.generation)

    def _cached(self, name: str, options: tuple, compute: Callable[[], Any]) -> Any:
        key = (name, options, self._weights_version(), self._recording_version())
        if key not in self._cache:
            start = time.perf_counter()
            self._cache[key] = compute()
            self.timings[name] = round(time.perf_counter() - start, 4)
        return self._cache[key]

    def _timed(self, name: str, compute: Callable[[], Any]) -> Callable[[], Any]:
        def run():
            start = time.perf_counter()
            result = compute()
            self.timings[f"section:{name}"] = round(time.perf_counter() - start, 4)
            return result
        return run

    # ------------------------------------------------------------------ pieces
    def layer_matrices(self, *, fold_norm: bool = False) -> torch.Tensor:
        return self._cached("F", (fold_norm,),
                            lambda: layer_matrices(self.probe.anatomy, fold_norm=fold_norm))

    def _tokens(self, capture: str) -> list:
        rec = self.probe.recording
        if rec.store == "stats" or capture not in rec.capture or not rec.steps:
            return [None] * self.probe.anatomy.n_layers
        return [rec.tokens(capture, layer) if layer in rec.layers else None
                for layer in range(self.probe.anatomy.n_layers)]

    def power(self, *, iterate: str = "F", fold_norm: bool = False):
        def compute():
            F = self.layer_matrices(fold_norm=fold_norm)
            layers = list(self.probe.recording.layers)
            return power_table(F, self._tokens("resid_pre"), self._tokens("resid_post"),
                               iterate=iterate, layers=layers)
        return self._cached("power", (iterate, fold_norm), compute)

    def spectra(self, *, iterate: str = "F", fold_norm: bool = False):
        return self._cached("spectra", (iterate, fold_norm), lambda: spectra_table(
            self.layer_matrices(fold_norm=fold_norm), iterate=iterate))

    def shared_groups(self) -> list[tuple[int, ...]]:
        """Shared-weight groups whose analysis the recording supports: resid_pre of the first
        application and resid_post of every application recorded, tokens kept."""
        rec = self.probe.recording
        if rec.store == "stats" or not {"resid_pre", "resid_post"} <= set(rec.capture):
            return []
        return [g for g in self.probe.anatomy.shared_groups if set(g) <= set(rec.layers)]

    def shared_weights(self, *, fold_norm: bool = False):
        def compute():
            F = self.layer_matrices(fold_norm=fold_norm)
            post, pre = self._tokens("resid_post"), self._tokens("resid_pre")
            tables = [shared_weight_table(F[g[0]], [post[i] for i in g], pre[g[0]])
                      .assign(group=n) for n, g in enumerate(self.shared_groups())]
            return pd.concat(tables, ignore_index=True)
        return self._cached("shared_weights", (fold_norm,), compute)

    # ------------------------------------------------------------------ report
    def metadata(self, options: dict) -> dict:
        anatomy, rec = self.probe.anatomy, self.probe.recording
        n_tokens = int(rec.mask.sum()) if rec.steps and rec.store != "stats" else None
        return {
            "model": type(anatomy.model).__name__,
            "family": anatomy.family,
            "name_or_path": getattr(anatomy.config, "_name_or_path", None) or None,
            "config_hash": config_hash(anatomy.config),
            "n_layers": anatomy.n_layers, "d_model": anatomy.d_model,
            "n_heads": anatomy.n_heads, "n_kv_heads": anatomy.n_kv_heads,
            "causal": anatomy.causal, "norm_placement": anatomy.norm_placement,
            "inputs": {"n_sequences": rec.n_samples, "n_tokens": n_tokens,
                       "n_forward_calls": len(rec.steps), "store": rec.store},
            "options": options,
            "versions": _versions(),
            "timings_s": self.timings,
        }

    def analyze(self, *, power: bool = True, iterate: str = "F", fold_norm: bool = False,
                jacobian: Any = None, bottleneck: bool = False, reinit: bool = False,
                **extra: Any) -> Report:
        """A :class:`Report` whose sections are computed when first read."""
        if iterate not in ("F", "I+F"):
            raise ValueError(f"iterate={iterate!r}: choose 'F' or 'I+F'")
        if not self.probe.recording.steps:
            raise ValueError("nothing recorded yet: run the model inside the probe first")
        sections: dict = {}
        if power:
            sections["power"] = lambda: self.power(iterate=iterate, fold_norm=fold_norm)
            sections["spectra"] = lambda: self.spectra(iterate=iterate, fold_norm=fold_norm)
            if self.shared_groups():
                sections["shared_weights"] = lambda: self.shared_weights(fold_norm=fold_norm)
            elif self.probe.anatomy.shared_groups:
                log.info("shared-weight section skipped: it needs resid_pre and resid_post of "
                         "every application of a shared block (store='device' or 'cpu')")
        from .jacobian_sections import jacobian_sections  # the Jacobian view, if requested

        sections.update(jacobian_sections(self, jacobian=jacobian, bottleneck=bottleneck,
                                          reinit=reinit, **extra))
        jacobian_spectra = sections.pop("jacobian_spectra", None)
        if jacobian_spectra is not None and "spectra" in sections:
            power_spectra = sections["spectra"]
            sections["spectra"] = lambda: pd.concat([power_spectra(), jacobian_spectra()],
                                                    ignore_index=True)
        sections = {name: self._timed(name, fn) for name, fn in sections.items()}
        options = {"power": power, "iterate": iterate, "fold_norm": fold_norm,
                   "jacobian": json.loads(json.dumps(jacobian, default=str)),
                   "bottleneck": bottleneck, "reinit": reinit, **extra}
        return Report(sections, self.metadata(options))
