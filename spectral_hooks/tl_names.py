"""TransformerLens hook names, wherever spectral_hooks names a layer or a capture point.

    >>> hook_name("resid_post", 3)
    'blocks.3.hook_resid_post'
    >>> parse("blocks.3.hook_resid_post"), parse("hook_attn_out"), parse("blocks.2")
    (('resid_post', 3), ('attn_out', None), (None, 2))
    >>> capture_points(["hook_resid_pre", "blocks.0.hook_resid_post"])
    ('resid_pre', 'resid_post')
    >>> layer_of("blocks.-1.hook_resid_post"), layer_of(4)
    (-1, 4)

Only the points a probe records have names: ``hook_resid_pre``, ``hook_resid_post`` and
``hook_attn_out`` of ``blocks.<l>``, and the attention probabilities ``attn_pattern``, named
``blocks.<l>.attn.hook_pattern`` as in TransformerLens (``hook_pattern`` for short);
``recording[("resid_post", 3)]`` as in TransformerLens.

    >>> hook_name("attn_pattern", 1), parse("blocks.1.attn.hook_pattern")
    ('blocks.1.attn.hook_pattern', ('attn_pattern', 1))
"""

from __future__ import annotations

import re
from typing import Any, Optional, Union

POINTS = ("resid_pre", "resid_post", "attn_out", "attn_pattern")
_FULL = re.compile(r"^(?:blocks\.(-?\d+)(?:\.hook_(\w+))?|hook_(\w+))$")
#: points whose TransformerLens hook sits in a submodule of the block: their name in it
_NESTED = {"attn_pattern": "attn.hook_pattern"}
_NESTED_NAME = re.compile(r"^(blocks\.-?\d+\.)?(attn\.)?hook_pattern$")


def hook_name(point: str, layer: int) -> str:
    """The TransformerLens name of ``point`` at ``layer``."""
    return f"blocks.{layer}.{_NESTED.get(point, 'hook_' + point)}"


def parse(name: str) -> tuple[Optional[str], Optional[int]]:
    """``(point, layer)`` named by a hook name, a ``blocks.<l>`` prefix, ``hook_<point>`` or
    a bare point (``"resid_post"``); None where the name says nothing. ValueError for any
    other name."""
    if name in POINTS:
        return name, None
    nested = _NESTED_NAME.match(name)
    if nested is not None:  # blocks.<l>.attn.hook_pattern, attn.hook_pattern, hook_pattern
        return "attn_pattern", (int(nested.group(1)[7:-1]) if nested.group(1) else None)
    full = _FULL.match(name)
    point = (full.group(2) or full.group(3)) if full else None
    if full is None or (point is not None and point not in POINTS) \
            or (point is None and full.group(1) is None):
        raise ValueError(f"unknown hook name {name!r}: use 'blocks.<l>.hook_resid_pre', "
                         "'blocks.<l>.hook_resid_post', 'blocks.<l>.hook_attn_out', "
                         "'blocks.<l>.attn.hook_pattern', 'blocks.<l>' or 'hook_<point>'")
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
