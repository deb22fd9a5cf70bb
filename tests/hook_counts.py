"""Counting what is attached to a model: PyTorch forward hooks and pre-hooks, and spectral_hooks
taps (``spectral_hooks/taps.py``: a module's ``forward`` attribute), so that a test of leaked
handles sees both kinds."""

from torch import nn

from spectral_hooks.taps import ForwardTap, _LastHook


def count_taps(model: nn.Module) -> int:
    """Taps in any module's forward chain, attached or left behind as pass-throughs."""
    total = 0
    for module in model.modules():
        forward = vars(module).get("forward")
        while isinstance(forward, ForwardTap):
            total += 1
            forward = forward.inner
    return total


def _part_of_a_tap(hook) -> bool:
    """The hook an attached tap keeps after other libraries' hooks (it goes with the tap)."""
    return isinstance(hook, _LastHook) and hook.tap is not None and hook.tap.attached


def count_hooks(model: nn.Module) -> int:
    """Forward hooks, forward pre-hooks and taps on every module of ``model`` (a tap's hook
    after other hooks counts as part of the tap; left behind by a removed one, as a hook)."""
    hooks = sum(len(m._forward_pre_hooks) for m in model.modules())
    hooks += sum(not _part_of_a_tap(h) for m in model.modules() for h in m._forward_hooks.values())
    return count_taps(model) + hooks
