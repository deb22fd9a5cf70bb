"""The probe's machinery: how its hooks attach and what they need to know about one forward.

- :mod:`.taps`: :class:`~.taps.ForwardTap`, a forward hook that keeps ``Module.__call__`` on
  its fast path, and the counts of hooks and taps on a model;
- :mod:`.forward_call`: one forward call of the model as the probe's hooks see it (which
  application of each shared module this is, what was captured, each block's replayable call,
  the deferred commit of what was recorded).

A block's call arguments are read by :mod:`spectral_hooks.recording.block_call`. The public
entry points are :func:`spectral_hooks.instrument` and :class:`spectral_hooks.Probe`
(``probe.py``), which use these.

    >>> from spectral_hooks.hooks.taps import count_hook_points
    >>> import torch
    >>> count_hook_points(torch.nn.Linear(2, 2))
    0
"""
