"""KeyboardInterrupt during a long analysis leaves no hooks, keeps the sections already
computed, and a second analysis works (issue 16, item 6).

The interrupt is injected by a forward hook on one block that raises KeyboardInterrupt the
first time the analysis replays that block, as Ctrl-C would in the middle of the Jacobian view.
"""

from __future__ import annotations

import pytest
import torch
from pandas.testing import assert_frame_equal

import spectral_hooks as sh
from spectral_hooks.hooks.taps import count_hook_points as count_hooks
from tests.reliability.fuzz_models import Case, build, hidden, inputs, state_hash
from tests.tiny_models import make_model


class _CtrlC:
    """A forward hook raising KeyboardInterrupt on its first ``after``-th call."""

    def __init__(self, after: int = 1) -> None:
        self.calls, self.after = 0, after

    def __call__(self, module, args, output):
        self.calls += 1
        if self.calls == self.after:
            raise KeyboardInterrupt


@pytest.mark.parametrize("family,jacobian", [("gpt2", {"k": 2, "dense": True}),
                                             ("bert", {"k": 2, "tol": 1e-6, "n_samples": 8})])
def test_interrupted_analysis_keeps_sections_and_leaves_no_hooks(family, jacobian):
    case = Case(family, n_layers=2, n_heads=2, kv_heads=2, head_dim=4, dtype=torch.float64,
                batch=2, seq=5, padding="right", seed=0)
    model, batch = build(case), inputs(case)
    weights, reference = state_hash(model), hidden(model, batch)
    with sh.instrument(model) as probe:
        hidden(model, batch)
        n_recorded = len(probe.recording.steps)
        hooks_attached = count_hooks(model)
        report = probe.analyze(power=True, jacobian=jacobian)
        power = report.power  # computed before the interrupt
        block = sh.anatomy_of(model).layers[-1].block
        ctrl_c = _CtrlC()
        handle = block.register_forward_hook(ctrl_c)
        try:
            with pytest.raises(KeyboardInterrupt):
                report.jacobian
        finally:
            handle.remove()
        assert ctrl_c.calls >= 1  # the interrupt did land inside the analysis
        assert count_hooks(model) == hooks_attached  # the analysis left none of its own
        assert len(probe.recording.steps) == n_recorded  # replays were not recorded
        assert_frame_equal(report.power, power)  # kept
        jac = report.jacobian  # the interrupted section can be computed again
        again = probe.analyze(power=True, jacobian=jacobian)  # and a second analysis works
        assert_frame_equal(again.jacobian, jac, check_exact=False, rtol=1e-6)
        assert_frame_equal(again.power, power)
        hidden(model, batch)
        assert len(probe.recording.steps) == n_recorded + 1  # the probe still records
    assert count_hooks(model) == 0 and state_hash(model) == weights
    assert torch.equal(hidden(model, batch), reference)


def test_interrupt_while_recording_removes_the_probe_hooks():
    model = make_model("llama", dtype=torch.float32)
    ids = torch.randint(0, 100, (1, 4))
    handle = model.layers[0].register_forward_hook(_CtrlC())
    try:
        with pytest.raises(KeyboardInterrupt):
            with sh.instrument(model):
                hidden(model, {"input_ids": ids})
    finally:
        handle.remove()
    assert count_hooks(model) == 0
