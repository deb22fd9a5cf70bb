"""What building and solving block Jacobians must not do, and what operators must say.

No draw from the global torch / numpy / Python RNG, no reference that keeps a model alive, no
torch.fx warning per Jacobian; operators carry typed fields; architecture facts come from the
anatomy; bad options and layers raise the library's errors.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import warnings
import weakref

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from tiny_models import make_model  # noqa: E402

import spectral_hooks as sh  # noqa: E402
from spectral_hooks.anatomy import anatomy_of  # noqa: E402
from spectral_hooks.errors import LayerIndexError, OptionError, UnsupportedModelError  # noqa: E402
from spectral_hooks.linalg import eigs  # noqa: E402
from spectral_hooks.linalg.protocols import BatchMember, Operator  # noqa: E402
from spectral_hooks.linearize import (  # noqa: E402
    BlockJacobian,
    JacobianProduct,
    StackedBlockJacobian,
    block_jacobian,
    jacobian_product,
)
from spectral_hooks.linearize.group import block_jacobian_group  # noqa: E402

IDS = torch.tensor([[5, 17, 3, 42, 8, 61, 2]])
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _recorded(family: str):
    model = make_model(family)
    with sh.instrument(model) as probe:
        with torch.no_grad():
            model(IDS)
    return model, probe


def _global_states():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()


@pytest.mark.parametrize("family", ["gpt2", "gpt_neo", "bert"])  # split, concat, full sequence
def test_jacobians_and_eigs_leave_the_global_random_streams_alone(family):
    _, probe = _recorded(family)
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    before = _global_states()
    J = block_jacobian(probe.anatomy, probe.recording, 1)
    eigs(J, 4, tol=1e-8)
    J.rmatvec(torch.ones(J.shape[0], dtype=torch.float64))
    eigs(jacobian_product(probe.anatomy, probe.recording, 0, 1), 3, tol=1e-8)
    after = _global_states()
    assert torch.equal(before[0], after[0])
    assert before[1] == after[1]
    assert np.array_equal(before[2], after[2])


def test_model_is_freed_after_jacobians_are_built_and_used():
    model, probe = _recorded("gpt2")
    J = block_jacobian(probe.anatomy, probe.recording, 1)  # split mode: the shared trace cache
    eigs(J, 4, tol=1e-8)
    ops = block_jacobian_group(probe.anatomy, probe.recording, [0, 1])
    assert ops is not None
    eigs(ops, 3, tol=1e-8)
    ref = weakref.ref(model)
    del model, probe, J, ops
    gc.collect()
    assert ref() is None


def test_operators_carry_typed_fields_and_no_fx_warnings():
    _, probe = _recorded("gpt2")
    an, rec = probe.anatomy, probe.recording
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. torch.fx const_fold's get_attr noise
        J = block_jacobian(an, rec, 1)
        J.matvec(torch.ones(J.shape[0], dtype=torch.float64))
        S = block_jacobian(an, rec, 0, kind="sequence", single_query=False)
        S.matvec(torch.ones(S.shape[0], dtype=torch.float64))
    assert isinstance(J, BlockJacobian) and isinstance(J, Operator)
    assert (J.layer, J.sample, J.positions, J.kind) == (1, 0, (IDS.shape[1] - 1,), "token")
    assert J.single_query_mode == "split" and J.single_query and J.block_size == 32
    assert S.kind == "sequence" and S.positions == tuple(range(IDS.shape[1]))
    assert S.single_query_mode is None and not S.single_query
    P = jacobian_product(an, rec, 0, 1)
    assert isinstance(P, JacobianProduct) and (P.first, P.last) == (0, 1)
    assert [F.layer for F in P.factors] == [0, 1] and P.positions == J.positions
    ops = block_jacobian_group(an, rec, [0, 1])
    assert ops is not None
    assert all(isinstance(o, StackedBlockJacobian) and isinstance(o, BatchMember) for o in ops)
    assert [o.batch_index for o in ops] == [0, 1] and ops[0].batch_group is ops[1].batch_group


def test_architecture_facts_come_from_the_anatomy():
    gemma2, neo = anatomy_of(make_model("gemma2")), anatomy_of(make_model("gpt_neo"))
    assert gemma2.layer_kinds is not None and len(set(gemma2.layer_kinds)) == 2
    assert set(neo.layer_kinds) == {"global", "local"}
    assert not neo.call_convention.pluggable_attention
    llama, gpt2 = anatomy_of(make_model("llama")), anatomy_of(make_model("gpt2"))
    assert llama.norm_upcasts and not gpt2.norm_upcasts
    assert gpt2.layer_kinds is None and gpt2.call_convention.hidden_kwarg == "hidden_states"
    assert gpt2.call_convention.cache_slot(gpt2.layers[0].block) is not None


def test_bad_options_and_layers_raise_the_library_errors():
    _, probe = _recorded("gpt2")
    an, rec = probe.anatomy, probe.recording
    with pytest.raises(OptionError, match=r"method='newton' is not valid.*'auto'"):
        block_jacobian(an, rec, 0, method="newton")
    with pytest.raises(OptionError, match=r"kind='row'"):
        block_jacobian(an, rec, 0, kind="row")
    with pytest.raises(LayerIndexError) as err:
        block_jacobian(an, rec, 7)
    assert isinstance(err.value, IndexError) and isinstance(err.value, ValueError)
    with pytest.raises(UnsupportedModelError):
        anatomy_of(torch.nn.Linear(3, 3))
