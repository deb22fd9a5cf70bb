"""What a report says about its run: :class:`ReportMetadata`, one frozen record with a declared
field for every key the library writes and ``extra`` for any other.

    >>> meta = ReportMetadata.from_mapping({"model": "GPT2Model", "label": "after"})
    >>> meta["model"], meta.extra, "fallbacks" in meta
    ('GPT2Model', {'label': 'after'}, False)
    >>> meta.replace(fallbacks=["eig"])["fallbacks"]
    ['eig']

It reads as a mapping (``report.metadata["options"]``, ``dict(report.metadata)``) of the fields
that are set (not None) and of ``extra``'s keys; it is written only through its constructor,
:meth:`ReportMetadata.from_mapping` and :meth:`ReportMetadata.replace`.
``spectral_hooks.report.storage`` saves it to and loads it from ``metadata.json``, with the same
flat keys as before. The library version has one key, ``spectral_hooks_version``: a report
saved before it held the version also in ``versions["spectral_hooks"]``, which is read into
``spectral_hooks_version`` when it loads.

Frozen is shallow: ``timings_s`` and ``fallbacks`` are filled in place while the lazy sections
of an analysis are computed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import OptionError, OptionTypeError

__all__ = ["ReportMetadata"]


@dataclass(frozen=True, eq=False)
class ReportMetadata(Mapping[str, Any]):
    """The metadata of a :class:`~spectral_hooks.report.Report` (every field optional).

        >>> ReportMetadata(model="BertModel", n_layers=6).to_dict()
        {'model': 'BertModel', 'n_layers': 6}
        >>> ReportMetadata(model="BertModel", extra={"label": "trained"})
        ReportMetadata(model='BertModel', extra={'label': 'trained'})

    Attributes:
        model: the model's class name.
        family: the anatomy family that read it.
        stack: "encoder" or "decoder" for an encoder-decoder model's stack.
        name_or_path: the checkpoint name or path, where known.
        config_hash: 16 hex digits of the SHA-256 of the model config's JSON.
        n_layers, d_model, n_heads, n_kv_heads, causal, norm_placement: anatomy facts.
        inputs: n_sequences, n_tokens, n_forward_calls and store of the recording.
        options: the resolved analysis options (``AnalyzeOptions.to_dict()``).
        spectral_hooks_version: the version that computed the report (the one that first saved
            it, for a report built by hand).
        versions: the other libraries' versions (torch, transformers, python).
        timings_s: seconds per computed section, filled as sections are computed.
        fallbacks: causes of the fallbacks taken while computing (``errors.fallback``).
        nan_reasons: why the columns that are NaN by design are, per section.
        jacobian: which computation the Jacobian view used and why.
        sections_skipped: requested sections not computed, with the reason.
        distributed: the ranks of a ``distributed=True`` analysis.
        compare: what ``Report.compare`` matched, skipped and dropped.
        texts: the input texts (the command-line tool).
        extra: any other key, JSON-able for saving.
    """

    model: Optional[str] = None
    family: Optional[str] = None
    stack: Optional[str] = None
    name_or_path: Optional[str] = None
    config_hash: Optional[str] = None
    n_layers: Optional[int] = None
    d_model: Optional[int] = None
    n_heads: Optional[int] = None
    n_kv_heads: Optional[int] = None
    causal: Optional[bool] = None
    norm_placement: Optional[str] = None
    layer_mixers: Optional[list[Optional[str]]] = None
    layer_mlps: Optional[list[Optional[str]]] = None
    power_coverage: Optional[str] = None
    inputs: Optional[dict[str, Any]] = None
    options: Optional[dict[str, Any]] = None
    spectral_hooks_version: Optional[str] = None
    versions: Optional[dict[str, str]] = None
    timings_s: Optional[dict[str, float]] = None
    fallbacks: Optional[list[str]] = None
    nan_reasons: Optional[dict[str, Any]] = None
    jacobian: Optional[dict[str, Any]] = None
    sections_skipped: Optional[dict[str, str]] = None
    distributed: Optional[dict[str, Any]] = None
    compare: Optional[dict[str, Any]] = None
    texts: Optional[list[str]] = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.extra, dict):
            raise OptionTypeError("extra", self.extra, "a dict of the keys no field declares")
        clash = sorted(set(self.extra) & set(FIELDS))
        if clash:
            raise OptionError("extra", f"a dict holding {clash}", "keys that no field declares",
                              hint="set those as fields: ReportMetadata(model=...)")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "ReportMetadata":
        """Declared keys to their fields, the others to ``extra``; a saved report's
        ``versions["spectral_hooks"]`` (the layout before ``spectral_hooks_version`` was the one
        key) becomes ``spectral_hooks_version``.

        >>> old = {"versions": {"spectral_hooks": "0.1.0", "torch": "2.13.0"},
        ...        "spectral_hooks_version": "0.1.0"}
        >>> meta = ReportMetadata.from_mapping(old)
        >>> meta.spectral_hooks_version, meta.versions
        ('0.1.0', {'torch': '2.13.0'})
        """
        if isinstance(values, ReportMetadata):
            return values
        if not isinstance(values, Mapping):
            raise OptionTypeError("metadata", values, "a mapping of name -> JSON-able value")
        fields = {k: v for k, v in values.items() if k in FIELDS}
        versions = fields.get("versions")
        if isinstance(versions, Mapping) and "spectral_hooks" in versions:
            versions = dict(versions)
            computed_by = versions.pop("spectral_hooks")
            fields["versions"] = versions
            fields["spectral_hooks_version"] = computed_by
        extra = {k: v for k, v in values.items() if k not in FIELDS}
        return cls(**fields, extra=extra)

    def replace(self, **changes: Any) -> "ReportMetadata":
        """A copy with ``changes``: declared keys set their field, others go to ``extra``.

        >>> ReportMetadata(model="m").replace(label="before").extra
        {'label': 'before'}
        """
        fields = {k: v for k, v in changes.items() if k in FIELDS}
        extra = {**self.extra, **{k: v for k, v in changes.items() if k not in FIELDS}}
        return dataclasses.replace(self, **fields, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """The set fields and ``extra``'s keys as one flat dict (the layout of metadata.json)."""
        out = {name: getattr(self, name) for name in FIELDS if getattr(self, name) is not None}
        out.update(self.extra)
        return out

    def __getitem__(self, key: str) -> Any:
        if key in FIELDS:
            value = getattr(self, key)
            if value is not None:
                return value
        elif key in self.extra:
            return self.extra[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return self.to_dict() == dict(other.items())

    __hash__ = None  # type: ignore[assignment]  # holds dicts; equal to a dict of its keys

    def __repr__(self) -> str:  # the set fields only: most are None on a hand-built report
        shown = [f"{name}={getattr(self, name)!r}" for name in FIELDS
                 if getattr(self, name) is not None]
        return f"ReportMetadata({', '.join(shown + ([f'extra={self.extra!r}'] if self.extra else []))})"


#: The declared fields (every key the library writes), in order.
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ReportMetadata)
                                if f.name != "extra")
