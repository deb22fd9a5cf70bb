"""Mixture-of-experts families (issue 15): Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE.

The block Jacobian at a point goes through the router: the top-k choice is locally constant,
the mixing weights are differentiated; the oracle is jacfwd of the real HF block (its "eager"
experts). HF's default grouped-matmul experts refuse float64 and forward AD: the replay must
switch to a traceable implementation for its duration (anatomy
``call_convention.replay_context``) and restore the user's setting, which the float32 test
checks against a float64 oracle."""

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.linearize import block_jacobian
from tests.families.configs_decoders import MOE, make
from tests.families.harness import check_family
from tests.oracles import eigvals_by_modulus, token_jacobian


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


def _aria_text():
    """A tiny Aria text model (generic fallback): its experts pick tokens with ``one_hot`` of
    the router's choices, which checks them on the host, so ``make_fx`` cannot trace the
    block for a layer group."""
    import transformers as tf

    config = tf.AriaTextConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=8, moe_num_experts=4, moe_topk=2,
                               moe_num_shared_experts=1, max_position_embeddings=64,
                               bos_token_id=0, eos_token_id=0, pad_token_id=0)
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    return tf.AutoModel.from_config(config).to(torch.float64).eval()


@pytest.mark.filterwarnings("ignore::spectral_hooks.errors.GenericAnatomyWarning")
@pytest.mark.parametrize("dense", [True, False])
def test_blocks_that_cannot_be_traced_as_a_group_run_one_by_one(dense):
    """The layer group's trace fails on the experts' host check: each layer is applied
    through its own operator (a fallback said once, by name), and the jacobian rows equal
    the dense eig of jacfwd of the real block."""
    model = _aria_text()
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_ids(6))
    report = probe.analyze(power=False, jacobian={"k": 3, "dense": dense, "group_layers": True,
                                                  "materialize": False}, progress=False)
    rows = report.jacobian
    assert "linearize.group_untraceable" in report.metadata["fallbacks"]
    assert list(rows["dense"]) == [dense, dense] and bool(rows["converged"].all())
    for layer in (0, 1):
        exact = eigvals_by_modulus(np.asarray(token_jacobian(probe, layer)))
        got = float(rows.loc[rows["layer"] == layer, "top_eig_abs"].iloc[0])
        assert abs(got - abs(exact[0])) <= 1e-9 * abs(exact[0]), (layer, got, exact[0])
