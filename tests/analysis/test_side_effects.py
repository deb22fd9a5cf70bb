"""A full analysis leaves the user's process as it found it: RNG streams, and no reference
that keeps the model alive once the probe and report are dropped."""

import gc
import random
import weakref

import numpy as np
import torch

import spectral_hooks as sh
from tests.tiny_models import make_model

FULL = dict(power=True, jacobian={"k": 4}, bottleneck=True, reinit=True, topology=True)


def _analyse(model, ids, **options):
    probe = sh.instrument(model)
    with torch.no_grad():
        model(ids)
    report = probe.analyze(**options)
    for name in report.sections:
        report[name]
    return probe, report


def _rng_states():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def test_global_random_streams_are_unchanged_by_a_full_analysis():
    model = make_model("gpt2")
    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(123); np.random.seed(123); random.seed(123)  # noqa: E702
    before = _rng_states()
    probe, report = _analyse(model, ids, **FULL)
    probe.remove()
    after = _rng_states()
    assert torch.equal(before[0], after[0])
    assert all(np.array_equal(a, b) for a, b in zip(before[1][1:2], after[1][1:2]))
    assert before[1][2:] == after[1][2:]
    assert before[2] == after[2]


def test_matrix_free_and_dense_analyses_leave_the_torch_stream_alone():
    model = make_model("bert")
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    for jacobian in ({"k": 4}, {"k": 4, "dense": True}):
        state = torch.get_rng_state()
        probe, report = _analyse(model, ids, power=True, jacobian=jacobian, bottleneck=True)
        probe.remove()
        assert torch.equal(state, torch.get_rng_state()), jacobian


def test_the_model_is_freed_after_probe_and_report_are_dropped():
    model = make_model("gpt2")
    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    probe, report = _analyse(model, ids, **FULL)
    probe.remove()
    ref = weakref.ref(model)
    del probe, report, model
    gc.collect()
    assert ref() is None


def test_the_model_is_freed_even_with_hooks_still_attached():
    model = make_model("llama")
    ids = torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(0))
    probe, report = _analyse(model, ids, power=True, jacobian={"k": 4})
    ref = weakref.ref(model)
    del probe, report, model
    gc.collect()
    assert ref() is None
