"""The capture points: the one table of what a probe can record, and their TransformerLens names.

    >>> [point.name for point in POINTS]
    ['resid_pre', 'resid_post', 'attn_out', 'attn_pattern']
    >>> DEFAULT_CAPTURES
    ('resid_pre', 'resid_post', 'attn_out')
    >>> RUN_ORDER
    ('resid_pre', 'attn_pattern', 'attn_out', 'resid_post')
    >>> hook_name("resid_post", 3)
    'blocks.3.hook_resid_post'
    >>> parse("blocks.3.hook_resid_post"), parse("hook_attn_out"), parse("blocks.2")
    (('resid_post', 3), ('attn_out', None), (None, 2))
    >>> capture_points(["hook_resid_pre", "blocks.0.hook_resid_post"])
    ('resid_pre', 'resid_post')
    >>> layer_of("blocks.-1.hook_resid_post"), layer_of(4)
    (-1, 4)

The attention probabilities ``attn_pattern`` are named ``blocks.<l>.attn.hook_pattern`` as in
TransformerLens (``hook_pattern`` for short); ``recording[("resid_post", 3)]`` as in
TransformerLens.

    >>> hook_name("attn_pattern", 1), parse("blocks.1.attn.hook_pattern")
    ('blocks.1.attn.hook_pattern', ('attn_pattern', 1))
    >>> describe("resid_post")
    'resid_post, the residual stream leaving the block'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Union

__all__ = ["CapturePoint", "POINTS", "CAPTURES", "DEFAULT_CAPTURES", "RUN_ORDER",
           "PER_TOKEN", "BLOCK_INPUT", "hook_name", "hook_names", "describe", "parse",
           "layer_of", "point_of", "capture_points", "layer_list"]


@dataclass(frozen=True)
class CapturePoint:
    """One point a probe can record at every layer.

    ``hook``: the TransformerLens name after ``blocks.<l>.``; ``run_order``: when the block
    runs it (0 first); ``default``: captured unless ``instrument(capture=...)`` says otherwise;
    ``anatomy_attr``: the :class:`~spectral_hooks.anatomy.LayerParts` attribute whose output
    is the point, where a hook on a module's output records it (None: ``resid_pre`` and
    ``resid_post`` fall back to the block's own call and output; ``attn_pattern`` is read where
    ``anatomy/patterns.py`` says); ``per_token``: a [batch, pos, d_model] tensor of token
    vectors (``attn_pattern`` is [batch, head, query, key])."""

    name: str
    hook: str
    run_order: int
    description: str
    default: bool
    anatomy_attr: Optional[str]
    per_token: bool


#: every capture point, in the order the package lists them
POINTS: tuple[CapturePoint, ...] = (
    CapturePoint("resid_pre", "hook_resid_pre", 0, "the residual stream entering the block",
                 True, "resid_pre_hook", True),
    CapturePoint("resid_post", "hook_resid_post", 3, "the residual stream leaving the block",
                 True, "resid_post_hook", True),
    CapturePoint("attn_out", "hook_attn_out", 2, "the attention output",
                 True, "attn_out_module", True),
    CapturePoint("attn_pattern", "attn.hook_pattern", 1,
                 "the attention probabilities [batch, head, query, key]", False, None, False),
)

_BY_NAME = {point.name: point for point in POINTS}
CAPTURES: tuple[str, ...] = tuple(_BY_NAME)
#: the default leaves out ``attn_pattern`` ([batch, head, pos, pos]: quadratic in the length)
DEFAULT_CAPTURES: tuple[str, ...] = tuple(p.name for p in POINTS if p.default)
RUN_ORDER: tuple[str, ...] = tuple(p.name for p in sorted(POINTS, key=lambda p: p.run_order))
PER_TOKEN: tuple[str, ...] = tuple(p.name for p in POINTS if p.per_token)
#: not a capture point: the block's recorded call input, named so in messages
BLOCK_INPUT = "block input"
_BLOCK_INPUT_TEXT = "the hidden state the block was called with (replayed by the Jacobian view)"

_FULL = re.compile(r"^(?:blocks\.(-?\d+)(?:\.hook_(\w+))?|hook_(\w+))$")
_NESTED = {p.hook: p.name for p in POINTS if "." in p.hook}  # a hook inside a block's submodule
_NESTED_NAME = re.compile(r"^(blocks\.-?\d+\.)?((?:\w+\.)*hook_\w+)$")


def describe(point: str) -> str:
    """``point`` and what it is, for messages (also :data:`BLOCK_INPUT`)."""
    if point == BLOCK_INPUT:
        return f"{point}, {_BLOCK_INPUT_TEXT}"
    return f"{point}, {_BY_NAME[point].description}" if point in _BY_NAME else point


def hook_name(point: str, layer: int) -> str:
    """The TransformerLens name of ``point`` at ``layer``."""
    return f"blocks.{layer}.{_BY_NAME[point].hook}"


def hook_names(layer: Union[int, str] = "<l>") -> str:
    """Every point's hook name at ``layer``, quoted, for messages."""
    return ", ".join(f"'{hook_name(p.name, layer)}'" for p in POINTS)  # type: ignore[arg-type]


def parse(name: str) -> tuple[Optional[str], Optional[int]]:
    """``(point, layer)`` named by a hook name, a ``blocks.<l>`` prefix, ``hook_<point>`` or
    a bare point (``"resid_post"``); None where the name says nothing. ValueError for any
    other name."""
    if name in _BY_NAME:
        return name, None
    nested = _NESTED_NAME.match(name)
    if nested is not None:  # blocks.<l>.attn.hook_pattern, attn.hook_pattern, hook_pattern
        suffix = nested.group(2)
        point = _NESTED.get(suffix) or next(
            (n for hook, n in _NESTED.items() if hook.rsplit(".", 1)[1] == suffix), None)
        if point is not None:
            return point, (int(nested.group(1)[7:-1]) if nested.group(1) else None)
    full = _FULL.match(name)
    point = (full.group(2) or full.group(3)) if full else None
    if full is None or (point is not None and point not in _BY_NAME) \
            or (point is None and full.group(1) is None):
        raise ValueError(f"unknown hook name {name!r}: use {hook_names()}, 'blocks.<l>' or "
                         "'hook_<point>'")
    return point, (int(full.group(1)) if full.group(1) is not None else None)


def layer_of(layer: Union[int, str, Any]) -> Any:
    """A layer index from an int or a name that carries a layer; anything else unchanged
    (the caller's own check reports it)."""
    if isinstance(layer, str):
        point_layer = parse(layer)[1]
        if point_layer is None:
            raise ValueError(f"{layer!r} names no layer: use e.g. 'blocks.3' or "
                             "'blocks.3.hook_resid_post'")
        return point_layer
    return layer


def point_of(point: str) -> str:
    """A capture point from ``"resid_post"``, ``"hook_resid_post"`` or a full hook name;
    an unknown string is returned unchanged (the caller's own check reports it)."""
    try:
        parsed = parse(point)[0]
    except ValueError:
        return point
    return parsed if parsed is not None else point


def capture_points(capture: Union[str, Any]) -> tuple[str, ...]:
    """``instrument(capture=...)``: one point or several, by any name, duplicates dropped."""
    items = (capture,) if isinstance(capture, str) else tuple(capture)
    points = [point_of(c) if isinstance(c, str) else c for c in items]
    return tuple(dict.fromkeys(points))


def layer_list(layers: Any) -> Any:
    """``instrument(layers=...)``: ints and names mixed; one int or name alone is a list."""
    if layers is None:
        return None
    items = [layers] if isinstance(layers, (int, str)) else list(layers)
    return [layer_of(layer) for layer in items]
