"""Steering is stack-safe: nested and interleaved edits restore every weight bit-exactly in any
exit order; bad gap/alpha are refused (issue 16: removing nested edits out of order left a weight
edited; ``steer(gap=2)`` and ``alpha=-5`` were accepted)."""

from __future__ import annotations

import itertools

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import OptionError
from spectral_hooks.steering import SteeringStateError
from tests.tiny_models import make_model


def _directions(model, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = sh.anatomy_of(model).d_model
    return [torch.randn(d, dtype=torch.float64, generator=g) for _ in range(n)]


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_bit_identical(model, snapshot):
    now = model.state_dict()
    assert now.keys() == snapshot.keys()
    for k, v in snapshot.items():
        assert torch.equal(now[k], v), f"{k} differs"


@pytest.mark.parametrize("family,dtype", [("gpt2", torch.float32), ("llama", torch.bfloat16)])
def test_every_exit_order_restores_bit_exactly(family, dtype):
    model = make_model(family, dtype=dtype)
    original = _snapshot(model)
    u = _directions(model, 4)
    layers = [-1, -1, 0, -1]  # three edits stacked on one weight, one on another, interleaved
    for order in itertools.permutations(range(4)):
        edits = [sh.steer(model, u[i], layer=layers[i], alpha=0.5 + i) for i in range(4)]
        for i in order:
            edits[i].remove()
            assert not edits[i].active
        _assert_bit_identical(model, original)


def test_newest_removal_restores_the_weight_it_found_and_older_removal_keeps_the_rest():
    model = make_model("gpt2", dtype=torch.float32)
    part = sh.anatomy_of(model).layers[-1]
    param = part.output.param
    u = _directions(model, 2)
    base = param.detach().clone()
    a = sh.steer(model, u[0], alpha=1.0)
    after_a = param.detach().clone()
    b = sh.steer(model, u[1], alpha=2.0)
    b.remove()  # newest first: exactly the weight b found
    assert torch.equal(param, after_a)
    b = sh.steer(model, u[1], alpha=2.0)
    a.remove()  # out of order: as if only b's edit (its own delta) had been applied
    assert torch.equal(param, (base.double() + b._delta).to(param.dtype))  # _delta: param layout
    assert b.active and not a.active
    b.remove()
    assert torch.equal(param, base)


def test_nested_contexts_exited_by_exceptions_restore():
    model = make_model("llama", dtype=torch.float32)
    original = _snapshot(model)
    u = _directions(model, 2)
    with pytest.raises(RuntimeError, match="body failed"):
        with sh.steer(model, u[0], gap=0.05):
            with sh.steer(model, u[1], layer=0, gap=0.05):
                raise RuntimeError("body failed")
    _assert_bit_identical(model, original)


def test_weight_changed_meanwhile_raises_before_touching():
    model = make_model("gpt2", dtype=torch.float32)
    param = sh.anatomy_of(model).layers[-1].output.param
    original = param.detach().clone()
    edit = sh.steer(model, _directions(model, 1)[0], alpha=1.0)
    with torch.no_grad():
        param.add_(1.0)  # e.g. an optimizer step while steering
    changed = param.detach().clone()
    with pytest.raises(SteeringStateError, match="changed by something else"):
        edit.remove()
    assert torch.equal(param, changed) and edit.active  # nothing touched
    with pytest.raises(SteeringStateError):
        sh.steer(model, _directions(model, 1)[0], alpha=1.0)
    assert torch.equal(param, changed)
    edit.remove(force=True)
    assert torch.equal(param, original) and not edit.active
    edit.remove()  # twice is fine


@pytest.mark.parametrize("kwargs,option", [
    ({"gap": 2}, "gap=2"), ({"gap": 1.0}, "gap=1.0"), ({"gap": 0}, "gap=0"),
    ({"gap": -0.1}, "gap=-0.1"), ({"gap": float("nan")}, "gap=nan"),
    ({"alpha": -5}, "alpha=-5"), ({"alpha": float("inf")}, "alpha=inf"),
    ({"alpha": float("nan")}, "alpha=nan"), ({"alpha": "1"}, "alpha='1'"),
])
def test_bad_gap_and_alpha_are_refused(kwargs, option):
    model = make_model("gpt2", dtype=torch.float32)
    original = _snapshot(model)
    with pytest.raises(OptionError) as info:
        sh.steer(model, _directions(model, 1)[0], **kwargs)
    assert str(info.value).startswith(option) and "expected" in str(info.value)
    _assert_bit_identical(model, original)
