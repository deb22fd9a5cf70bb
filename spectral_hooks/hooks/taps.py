"""Taps: forward hooks that keep ``Module.__call__`` on its fast path.

    >>> import torch
    >>> from torch import nn
    >>> layer, seen = nn.Linear(3, 3), []
    >>> tap = ForwardTap(layer, post=lambda module, args, kwargs, out: seen.append(out.shape))
    >>> _ = layer(torch.ones(2, 3))
    >>> seen, count_taps(layer)
    ([torch.Size([2, 3])], 1)
    >>> tap.remove()
    >>> "forward" in vars(layer), count_taps(layer)
    (False, 0)

Why: a module with any forward hook leaves ``Module.__call__``'s fast path and runs PyTorch's
hook dispatch, 7-13 us of Python a call in a host-bound transformer forward (1.5 us in a
micro-benchmark). On a forward whose time is Python and kernel launches (a GPU's, or the
CPU proxy's in ``benchmarks/recording_ab.py``) that alone was 1.02-1.03x for the 17 points
the probe needs. A tap is the module's ``forward`` for as long as it is attached: it calls the
hook functions around the forward it replaced, and the module keeps its fast path.

What it keeps of a hook's behaviour:

- ``pre(module, args, kwargs)`` sees the arguments the forward receives (after any pre-hooks);
  ``post(module, args, kwargs, output)`` sees the output. Both must return None: a tap never
  changes what the module computes.
- Where the module carries other forward hooks when it is called (an intervention, a cache),
  ``post`` runs after all of them, from a forward hook of the tap's kept last in the order: it
  sees the output they hand on. That hook goes when they do (at the next call) or with the
  tap; a call that raises records nothing.
- ``remove()`` restores exactly what was there (the class's forward, or another library's own
  ``forward`` attribute), also out of order and under another tap; where a foreign wrapper was
  put on top since, the tap stays in the chain as a pass-through and drops its hooks.
- ``inspect.signature(module.forward)`` still gives the forward's signature (``__wrapped__``),
  and a deep copy or a pickle of the module carries the forward, not the tap.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.nn.modules import module as _torch_module
from torch.utils.hooks import RemovableHandle

PreHook = Callable[[nn.Module, tuple, dict], None]
PostHook = Callable[[nn.Module, tuple, dict, Any], None]

_GLOBAL_FORWARD_HOOKS = _torch_module._global_forward_hooks


class ForwardTap:
    """``pre`` and/or ``post`` around ``module``'s forward, attached on construction; removed
    by :meth:`remove` (the interface of a ``RemovableHandle``)."""

    __slots__ = ("module", "inner", "own", "pre", "post", "last_hook", "__weakref__")

    def __init__(self, module: nn.Module, *, pre: Optional[PreHook] = None,
                 post: Optional[PostHook] = None) -> None:
        self.module: nn.Module = module
        self.own: bool = "forward" in vars(module)  # another library's forward attribute, kept
        self.inner: Callable[..., Any] = module.forward
        self.pre, self.post = pre, post
        self.last_hook: Optional[RemovableHandle] = None  # the handle of our hook after other libraries' hooks
        # straight into the instance dict: some modules' __setattr__ forwards attributes to
        # a module they wrap (TransformerLens 4's bridge components)
        vars(module)["forward"] = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, pre = self.module, self.pre
        if pre is not None:
            pre(module, args, kwargs)
        output = self.inner(*args, **kwargs)
        post = self.post
        if post is not None:
            if not (module._forward_hooks or _GLOBAL_FORWARD_HOOKS or self.last_hook):
                post(module, args, kwargs, output)  # the common case, without a call more
            elif not self._post_from_last_hook(module):
                post(module, args, kwargs, output)
        return output

    def _post_from_last_hook(self, module: nn.Module) -> bool:
        """True where ``post`` will run from a forward hook of ours placed after the module's
        other forward hooks (PyTorch reads its hook dict after the forward returns): it sees
        the output they hand on. Without other hooks, none of ours stays on."""
        hooks, handle = module._forward_hooks, self.last_hook
        ours = handle is not None and handle.id in hooks
        if torch.compiler.is_compiling():  # no changes to hooks while compiling
            return ours
        if not (len(hooks) - ours or _GLOBAL_FORWARD_HOOKS):
            if handle is not None:
                handle.remove()
                self.last_hook = None
            return False
        if handle is None or not ours:
            self.last_hook = module.register_forward_hook(_LastHook(self), with_kwargs=True)
        elif next(reversed(hooks)) != handle.id:
            hooks[handle.id] = hooks.pop(handle.id)  # a hook came after ours: ours goes last
        return True

    @property
    def __wrapped__(self) -> Callable[..., Any]:  # inspect.signature follows it
        return self.inner

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy (``copy.deepcopy``, ``pickle``) gets the forward this tap wraps, not the tap:
        the copy's own class forward where the tap was the only attribute."""
        if self.own:
            return (_same, (self.inner,))
        return (getattr, (self.module, "forward"))

    @property
    def attached(self) -> bool:
        """False once :meth:`remove` ran (a pass-through left under a foreign forward)."""
        return self.pre is not None or self.post is not None

    def remove(self) -> None:
        """Take the tap out of the module's forward chain (idempotent)."""
        if not self.attached:
            return
        self.pre = self.post = None
        if self.last_hook is not None:
            self.last_hook.remove()
            self.last_hook = None
        attrs = vars(self.module)
        if attrs.get("forward") is self:
            if self.own:
                attrs["forward"] = self.inner
            else:
                del attrs["forward"]
            return
        above = attrs.get("forward")
        while isinstance(above, ForwardTap):
            if above.inner is self:
                above.inner, above.own = self.inner, self.own
                return
            above = above.inner
        # a foreign forward sits on top: this tap stays in its chain as a pass-through


def _same(value: Any) -> Any:
    return value


class _LastHook:
    """The forward hook that runs a tap's ``post`` after the module's other hooks. A copy of
    the module (``deepcopy``, ``pickle``) gets an inert one: the copy records nothing."""

    __slots__ = ("tap",)

    def __init__(self, tap: Optional[ForwardTap] = None) -> None:
        self.tap = tap

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        post = self.tap.post if self.tap is not None else None
        if post is not None:
            post(module, args, kwargs, output)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_LastHook, ())


def taps_on(module: nn.Module, *, detached: bool = False) -> list[ForwardTap]:
    """The attached taps in ``module``'s forward chain, outermost first (``detached``: also
    the pass-throughs removed taps left under a foreign forward)."""
    found, forward = [], vars(module).get("forward")
    while isinstance(forward, ForwardTap):
        if detached or forward.attached:
            found.append(forward)
        forward = forward.inner
    return found


def count_taps(model: nn.Module, *, detached: bool = False) -> int:
    """Attached taps on ``model`` and its submodules (``detached``: pass-throughs too)."""
    return sum(len(taps_on(m, detached=detached)) for m in model.modules())


def is_tap_hook(hook: Any) -> bool:
    """Whether a forward hook is an attached tap's own (the one that runs its ``post`` after
    other libraries' hooks): it goes with the tap."""
    return isinstance(hook, _LastHook) and hook.tap is not None and hook.tap.attached


def count_hook_points(model: nn.Module) -> int:
    """Everything that watches ``model``'s forwards: forward hooks and pre-hooks on every
    module, and taps, attached or left as pass-throughs (an attached tap's own hook counts
    as part of the tap; a removed tap's, as a hook). What a test of leaked handles counts."""
    hooks = sum(len(m._forward_pre_hooks) for m in model.modules())
    hooks += sum(not is_tap_hook(h) for m in model.modules() for h in m._forward_hooks.values())
    return count_taps(model, detached=True) + hooks
