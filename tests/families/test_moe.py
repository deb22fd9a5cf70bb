"""Mixture-of-experts families (issue 15): Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE.

The block Jacobian at a point goes through the router: the top-k choice is locally constant,
the mixing weights are differentiated; the oracle is jacfwd of the real HF block (its "eager"
experts). HF's default grouped-matmul experts refuse float64 and forward AD: the replay must
switch to a traceable implementation for its duration (anatomy
``call_convention.replay_context``) and restore the user's setting, which the float32 test
checks against a float64 oracle."""

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.linearize import block_jacobian
from tests.families.configs_decoders import MOE, make
from tests.families.harness import check_family
from tests.oracles import token_jacobian


def _ids(length: int = 5) -> dict:
    return {"input_ids": torch.randint(0, 100, (1, length),
                                       generator=torch.Generator().manual_seed(2))}


@pytest.mark.parametrize("name", MOE)
def test_moe_family(name):
    check_family(make(name), _ids(), value_in="self_attn.v_proj", output="self_attn.o_proj",
                 causal=True, family=name, k=2)


def test_float32_grouped_experts_replay_in_float64_through_the_router():
    model = make("mixtral", dtype=torch.float32)
    config = model.config
    assert config._experts_implementation not in (None, "eager")  # the transformers default
    own = config._experts_implementation
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_ids())
    anatomy, rec = probe.anatomy, probe.recording
    for layer in (anatomy.n_layers - 1,):
        got = block_jacobian(anatomy, rec, layer, dtype=torch.float64).to_dense()
        assert config._experts_implementation == own  # restored after the replay
        assert got.dtype == torch.float64
        config._experts_implementation = "eager"  # the oracle's float64 copy of the block
        try:
            want = token_jacobian(probe, layer)
        finally:
            config._experts_implementation = own
        scale = float(want.abs().max())
        assert float((got - want).abs().max()) <= 1e-10 * scale, layer


def test_router_weights_are_differentiated():
    """The Jacobian differs from the one with the router's mixing weights frozen: the replay
    differentiates the gate, not only the experts."""
    model = make("qwen3_moe")
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_ids())
    J = block_jacobian(probe.anatomy, probe.recording, 0).to_dense()
    gate = model.layers[0].mlp.gate
    own = gate.forward

    def frozen(hidden_states):
        logits, weights, index = own(hidden_states)
        return logits, weights.detach(), index
    gate.forward = frozen
    try:
        J_frozen = token_jacobian(probe, 0)
    finally:
        del gate.forward
    assert float((J - J_frozen).abs().max()) > 1e-6 * float(J.abs().max())
