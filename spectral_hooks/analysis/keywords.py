"""The keywords of ``probe.analyze(...)``, typed: one per field of :class:`AnalyzeOptions`.

``Probe.analyze(**keywords: Unpack[AnalyzeKeywords])`` (PEP 692) lets an editor and a type
checker show and check each keyword, while ``analyze`` still tells a keyword given from one left
out (a keyword overrides the same field of an ``options`` object; one left out keeps it). The
defaults and the checks stay in :class:`AnalyzeOptions`, the one home of each option:

    >>> import dataclasses
    >>> from spectral_hooks.analysis.options import AnalyzeOptions
    >>> sorted(AnalyzeKeywords.__annotations__) == sorted(
    ...     f.name for f in dataclasses.fields(AnalyzeOptions))
    True
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, TypedDict, Union

from .options import IdealisedOptions, JacobianOptions, PowerOptions, TopologyOptions

__all__ = ["AnalyzeKeywords"]


class AnalyzeKeywords(TypedDict, total=False):
    """``analyze``'s keywords; what each means: :class:`AnalyzeOptions`' attributes."""

    power: Union[bool, PowerOptions, Mapping[str, Any]]
    iterate: str
    fold_norm: bool
    jacobian: Union[None, bool, JacobianOptions, Mapping[str, Any]]
    bottleneck: bool
    reinit: bool
    reinit_seeds: int
    topology: Union[bool, TopologyOptions, Mapping[str, Any]]
    idealised: Union[bool, IdealisedOptions, Mapping[str, Any]]
    tokenizer: Any
    progress: Optional[bool]
