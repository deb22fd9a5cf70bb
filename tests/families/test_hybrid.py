"""Every model people load in 2026 (issue 54): hybrid stacks (Qwen3-Next, Qwen3.5 dense and
MoE, Jamba, Granite-4 hybrid, LFM2, Falcon-H1, MiniMax), pure Mamba-2, latent attention
(DeepSeek-V3, V3.2 and GLM-5 with a top-k indexer, GLM-4.7-Flash), routed experts with grouped
kernels (gpt-oss, GLM-4.5, dots1, Phi-MoE), sliding/full and RoPE/NoPE stacks (EXAONE 4,
Cohere2, SmolLM3); Gemma 3n's AltUp residual streams with KV sharing; Gemma 4's per-layer
head sizes, keys-as-values and experts beside the dense MLP.

The quick profile runs one architecture of each mixer kind end to end and three oracle cases;
``make test-all`` runs every one. Oracles that do not use the library's code path: the model's
own ``output_hidden_states``; ``torch.func.jacfwd`` of the real block (tests/oracles.py) and ``numpy``'s eig for the
matrix-free Jacobian spectra; a least-squares fit of the raw attention modules for MLA's F.
"""

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import spectral_hooks as sh
from spectral_hooks.errors import MissingWeightsError, UnsupportedModelError
from spectral_hooks.linalg import eigs
from spectral_hooks.linearize import block_jacobian
from tests.families.configs_hybrid import SUPPORTED, make
from tests.families.harness import oracle_F
from tests.oracles import assert_same_spectrum, block_output, eigvals_by_modulus, token_jacobian
from tests.profiles import quick_subset

GROUPED_FALLBACKS = {"linearize.group_member_alone", "linearize.own_trace"}
KINDS = {  # (mixer, mlp) per layer, as each architecture stacks them
    "deepseek_v3": [("mla", "dense"), ("mla", "routed+shared")],
    "deepseek_v32": [("mla", "dense"), ("mla", "routed+shared")],
    "glm_moe_dsa": [("mla", "dense"), ("mla", "routed+shared")],
    "glm4_moe_lite": [("mla", "dense"), ("mla", "routed+shared")],
    "qwen3_next": [("linear_attention", "routed+shared"), ("gqa", "routed+shared")],
    "qwen3_5_text": [("linear_attention", "dense"), ("gqa", "dense")],
    "qwen3_5_moe_text": [("linear_attention", "routed+shared"), ("gqa", "routed+shared")],
    "lfm2": [("short_conv", "dense"), ("gqa", "dense")],
    "granitemoehybrid": [("state_space", "routed+shared"), ("gqa", "routed+shared")],
    "jamba": [("state_space", "dense"), ("gqa", "routed")],
    "mamba2": [("state_space", "none"), ("state_space", "none")],
    "gpt_oss": [("gqa", "routed")] * 2,
    "glm4_moe": [("gqa", "dense"), ("gqa", "routed+shared")],
    "dots1": [("gqa", "dense"), ("gqa", "routed+shared")],
    "phimoe": [("gqa", "routed")] * 2,
    "minimax": [("linear_attention", "routed"), ("gqa", "routed")],
    "exaone4": [("gqa", "dense")] * 2,
    "smollm3": [("gqa", "dense")] * 2,
    "cohere2": [("gqa", "dense")] * 2,
    "falcon_h1": [("attention+ssm", "dense")] * 2,
}


# beside F's path: attention sinks; an output gate; the latent norm's per-token scale (MLA)
OUTSIDE_F = {"gpt_oss", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "deepseek_v3",
             "deepseek_v32", "glm_moe_dsa", "glm4_moe_lite"}


def _batch() -> dict:
    ids = torch.randint(1, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded row
    return {"input_ids": ids, "attention_mask": mask}


def _recorded_bit_identically(model):
    """(batch, outputs, probe) of one recorded forward on :func:`_batch`, whose outputs are
    bit-identical to the model's own; the probe has left no handle."""
    batch = _batch()
    with torch.no_grad():
        expected = model(**batch, output_hidden_states=True)
        with sh.instrument(model) as probe:
            out = model(**batch, output_hidden_states=True)
    assert torch.equal(out.last_hidden_state, expected.last_hidden_state)
    assert probe.n_handles == 0
    return batch, out, probe


@pytest.mark.parametrize("name", quick_subset(SUPPORTED, keep={
    "deepseek_v3", "lfm2", "jamba", "minimax", "gpt_oss", "exaone4"}))  # a mixer kind each
def test_recorded_exactly_and_analysed(name):
    model = make(name, dtype=torch.float32)  # the user's dtype: grouped experts, fused paths
    anatomy = sh.anatomy_of(model)
    assert anatomy.family in (name, "mamba", "deepseek_v3", "deepseek_v32", "granitemoehybrid",
                              "qwen3_next")
    assert [(p.mixer, p.mlp) for p in anatomy.layers] == KINDS[name]
    batch, out, probe = _recorded_bit_identically(model)
    real = batch["attention_mask"].bool()
    rec = probe.recording
    for layer in range(anatomy.n_layers):
        assert torch.equal(rec.resid_pre[layer][real], out.hidden_states[layer][real])
        if layer < anatomy.n_layers - 1:  # the last hidden state is normalised
            assert torch.equal(rec.resid_post[layer][real], out.hidden_states[layer + 1][real])
        assert rec.has("attn_out", layer) == (anatomy.layers[layer].attention is not None)
    report = probe.analyze(jacobian=True, progress=False)
    power, jacobian = report.power, report.jacobian
    assert sorted(power["layer"]) == list(anatomy.ov_layers)
    assert sorted(set(jacobian["layer"])) == list(range(anatomy.n_layers))
    assert np.isfinite(jacobian.select_dtypes("number").drop(columns=[
        c for c in jacobian.columns if jacobian[c].isna().all()])).all().all()
    assert not GROUPED_FALLBACKS & set(report.metadata["fallbacks"])
    assert "linearize.full_sequence" not in report.metadata["fallbacks"]
    assert report.metadata["layer_mixers"] == [m for m, _ in KINDS[name]]
    note = report.metadata.get("power_coverage")
    without = [t for t in range(anatomy.n_layers) if not anatomy.layers[t].has_ov_map]
    noted = bool(without) or KINDS[name][0][0] == "attention+ssm" or name in OUTSIDE_F
    assert (note is None) == (not noted)


def _float64_probe(name):
    model = make(name)
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_batch())
    return probe


@pytest.mark.parametrize("name, layer", quick_subset(
    [("deepseek_v3", 1), ("deepseek_v32", 1), ("glm_moe_dsa", 0), ("glm4_moe_lite", 1),
     ("jamba", 0), ("mamba2", 1), ("qwen3_next", 0), ("minimax", 1), ("gpt_oss", 0),
     ("gemma4_text", 0), ("gemma4_text", 1), ("gemma4_text", 3), ("qwen3_5_text", 0),
     ("qwen3_5_text", 1), ("qwen3_5_moe_text", 1)],
    keep={("deepseek_v3", 1), ("deepseek_v32", 1), ("jamba", 0), ("qwen3_next", 0),
          ("gemma4_text", 1), ("gemma4_text", 3), ("qwen3_5_text", 1)}))
def test_matrix_free_equals_dense_on_every_mixer(name, layer):
    """MLA + routed/shared experts (V3.2, GLM-5: a top-k indexer), Mamba, Mamba-2, Gated
    DeltaNet and gated attention (Qwen3-Next, Qwen3.5), routed experts (gpt-oss: sinks and
    biases), Gemma 4 (0: sliding; 1: full, keys = values, its own head size; 3: keys and
    values reused from layer 1): the library's dense Jacobian = jacfwd of the real block, and
    the matrix-free top-k eigenvalues = numpy's eig."""
    probe = _float64_probe(name)
    want = token_jacobian(probe, layer, sample=0)
    op = block_jacobian(probe.anatomy, probe.recording, layer)
    got = op.to_dense()
    assert float((got - want).abs().max()) <= 1e-10 * float(want.abs().max())
    result = eigs(op, 4, tol=1e-10, seed=0, return_vectors=False)
    assert bool(result.converged)
    got_values = np.asarray(result.values)  # 4, or 5 where the 4th is half a conjugate pair
    exact = eigvals_by_modulus(np.asarray(want))[:len(got_values)]
    assert_same_spectrum(got_values, exact, 1e-8)


@pytest.mark.parametrize("name", quick_subset(
    ["deepseek_v3", "deepseek_v32", "glm_moe_dsa", "glm4_moe_lite"], keep={"deepseek_v32"}))
def test_latent_attention_F_equals_a_fit_of_the_raw_modules(name):
    """MLA (DeepSeek-V3; V3.2 and GLM-5 with their top-k indexer; GLM-4.7-Flash): F = sum_h
    W_O^h W_V^h with W_V read through the latent (kv_a_proj_with_mqa, the latent norm's gain,
    kv_b_proj's value rows); the oracle fits the raw modules on one-token inputs with the
    latent RMSNorm's per-token scale taken out (its gain kept)."""
    model = make(name)
    anatomy = sh.anatomy_of(model)
    for part in anatomy.layers:
        norm = part.block.self_attn.kv_a_layernorm
        norm.forward = lambda x, norm=norm: norm.weight * x  # gain only: the map is linear
        try:
            want = oracle_F(model, part.block, "self_attn.kv_a_proj_with_mqa",
                            "self_attn.o_proj", anatomy.d_model)
        finally:
            del norm.forward
        F = torch.einsum("hdk,hkm->dm", part.output_weights(), part.value_weights())
        torch.testing.assert_close(F, want, rtol=1e-6, atol=1e-6)
    power = sh.instrument(model)
    with power, torch.no_grad():
        model(**_batch())
    F_lib = sh.layer_matrices(model)
    assert torch.isfinite(F_lib).all() and F_lib.shape == (2, 32, 32)


def test_layers_without_an_OV_map_say_so():
    model = make("jamba", dtype=torch.float32)
    anatomy = sh.anatomy_of(model)
    with pytest.raises(MissingWeightsError, match=r"layer 0 is a state_space mixer "
                                                  r"\(JambaMambaMixer\)"):
        anatomy.layers[0].value_weights()
    F = sh.layer_matrices(model)
    assert torch.isnan(F[0]).all() and torch.isfinite(F[1]).all()
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_batch())
    report = probe.analyze(power=True, progress=False)
    assert report.power["layer"].tolist() == [1]
    assert "layer 0: a state_space mixer (JambaMambaMixer)" in report.metadata["power_coverage"]
    assert "no power rows for layer 0: a state_space mixer" in report.to_html(figures=False)
    with pytest.raises(sh.errors.RecordingError, match="no attn_out at layer 0"):
        probe.recording.attn_out[0]
    assert probe.recording.attn_out.keys() == (1,)


@pytest.mark.parametrize("name, said", [
    ("qwen3_next", "outside F: the attention output's gate"),
    ("gpt_oss", "outside F: attention sinks"),
    ("gemma4_text", "outside F: the values' RMS norm (v_norm)"),
    ("deepseek_v3", "outside F: the latent norm's per-token scale (kv_a_layernorm"),
    ("exaone4", None)])
def test_what_F_leaves_out_between_the_values_and_the_output_is_said(name, said):
    """F = W_O W_V is the ungated, unnormalised OV map: a report whose layers put a gate, a
    norm, a scale or sinks on that path says so in ``power_coverage`` (a plain GQA layer: no
    note)."""
    coverage = sh.anatomy_of(make(name, dtype=torch.float32)).power_coverage()
    assert coverage is None if said is None else said in coverage


@pytest.mark.filterwarnings("ignore::spectral_hooks.errors.GenericAnatomyWarning")
def test_a_norm_on_the_attention_output_is_said_and_a_residual_post_norm_is_not():
    """BitNet normalises the attention output before W_O (``attn_sub_norm``: outside F);
    ALBERT's attention module holds the post-norm of the residual sum (``LayerNorm``: after
    the attention's contribution is added, so not on F's path)."""
    import transformers as tf

    from tests.tiny_models import make_model

    bitnet = tf.BitNetModel(tf.BitNetConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2,
                                            intermediate_size=64))
    assert "outside F: a norm on the values or the attention output (attn_sub_norm)" in \
        sh.anatomy_of(bitnet).power_coverage()
    assert sh.anatomy_of(make_model("albert")).power_coverage() is None


def test_a_pure_state_space_model_has_no_power_rows_but_a_full_jacobian_view():
    model = make("mamba2", dtype=torch.float32)
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_batch())
    report = probe.analyze(jacobian=True, progress=False)
    assert len(report.power) == 0 and len(report.spectra.query("source == 'F'")) == 0
    assert "state_space" in report.metadata["power_coverage"]
    assert len(report.jacobian) == 2


def test_falcon_h1_power_view_says_the_parallel_mixer_is_outside_F():
    model = make("falcon_h1", dtype=torch.float32)
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_batch())
    report = probe.analyze(power=True, progress=False)
    assert len(report.power) == 2
    assert "outside F" in report.metadata["power_coverage"]


def _streams_as_tokens(state):
    """Gemma 3n's block state [streams, batch, pos, d] as the probe records it: each position's
    streams side by side, [batch, pos, streams * d] (the layout docs/guide.md states)."""
    return state.permute(1, 2, 0, 3).reshape(state.shape[1], state.shape[2], -1)


def _check_kv_sharing_analysis(probe, said: str):
    """The analysis of a 4-layer model whose layers 2-3 reuse 0-1's keys and values: power
    rows for 0-1 only, the coverage note says why (and ``said``), every block has converged
    Jacobian rows, no grouped fallback. Returns the report."""
    report = probe.analyze(jacobian=True, progress=False)
    assert report.power["layer"].tolist() == [0, 1]
    note = report.metadata["power_coverage"]
    assert "layers 2, 3" in note and "KV sharing" in note and said in note
    assert sorted(set(report.jacobian["layer"])) == [0, 1, 2, 3]
    assert np.isfinite(report.jacobian["top_eig_abs"]).all()
    assert bool(report.jacobian["converged"].all())
    assert not GROUPED_FALLBACKS & set(report.metadata["fallbacks"])
    return report


def test_gemma3n_altup_streams_are_recorded_exactly_and_analysed():
    """AltUp (3 streams), per-layer inputs, Gaussian top-k MLP sparsity, KV sharing (layers
    2-3 reuse layers 0-1's keys and values): the forward is bit-identical, the recording is the
    model's own hidden states (every stream), the power view covers layers 0-1 on the active
    stream and says why 2-3 have no rows, the Jacobian view covers all four blocks."""
    model = make("gemma3n_text", dtype=torch.float32)
    anatomy = sh.anatomy_of(model)
    assert [(p.mixer, p.mlp, p.has_ov_map) for p in anatomy.layers] == \
        [("gqa", "dense", True)] * 2 + [("gqa", "dense", False)] * 2
    assert anatomy.residual_width == 3 * 32
    batch, out, probe = _recorded_bit_identically(model)
    real, rec = batch["attention_mask"].bool(), probe.recording
    for layer in range(4):
        assert torch.equal(rec.resid_pre[layer][real],
                           _streams_as_tokens(out.hidden_states[layer])[real])
        assert torch.equal(rec.resid_post[layer][real],
                           _streams_as_tokens(out.hidden_states[layer + 1])[real])
    _check_kv_sharing_analysis(probe, "active stream")


def test_gemma3n_power_rows_read_the_active_stream():
    """The power rows equal power_table of F on the active stream's tokens, taken from the
    model's own hidden states (stream 0 of [streams, batch, pos, d])."""
    from spectral_hooks.metrics.power import power_table

    model = make("gemma3n_text", dtype=torch.float32)
    batch = _batch()
    with sh.instrument(model) as probe, torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    report = probe.analyze(power=True, progress=False)
    real = batch["attention_mask"].bool()
    F = sh.layer_matrices(model).to(torch.float64)
    states = [h[0][real].to(torch.float64) for h in out.hidden_states]  # the active stream
    want = power_table(F[:2], states[:2], states[1:3], layers=[0, 1])
    for column in ("gap_ratio", "gamma_in", "gamma", "mean_cos", "n_tokens"):
        np.testing.assert_allclose(report.power[column].to_numpy(float),
                                   want[column].to_numpy(float), rtol=1e-9, atol=1e-12)


def test_gemma3n_training_power_rows_equal_analyze():
    """The training callbacks' per-layer power rows read the same active stream."""
    from spectral_hooks.integrations.power_log import power_rows

    model = make("gemma3n_text", dtype=torch.float32)
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_batch())
        rows = power_rows(probe)
    want = probe.analyze(power=True, progress=False).power
    assert rows["layer"].tolist() == want["layer"].tolist() == [0, 1]
    for column in ("gap_ratio", "gamma", "gamma_in", "gamma_ref", "mean_cos"):
        np.testing.assert_allclose(rows[column].to_numpy(float), want[column].to_numpy(float),
                                   rtol=1e-12)


def test_gemma3n_F_equals_a_fit_of_the_raw_modules():
    """F = W_O W_V of a layer with its own values, fitted through v_proj and o_proj with the
    values' RMS norm (no gain) taken out; the KV-sharing layers have none (NaN)."""
    model = make("gemma3n_text")
    anatomy = sh.anatomy_of(model)
    F_lib = sh.layer_matrices(model)
    for part in anatomy.layers[:2]:
        norm = part.block.self_attn.v_norm
        norm.forward = lambda x: x
        try:
            want = oracle_F(model, part.block, "self_attn.v_proj", "self_attn.o_proj", 32)
        finally:
            del norm.forward
        torch.testing.assert_close(F_lib[part.index], want, rtol=1e-6, atol=1e-6)
    assert torch.isnan(F_lib[2:]).all()


@pytest.mark.filterwarnings("ignore::spectral_hooks.errors.FallbackWarning")  # plain jvp
@pytest.mark.parametrize("layer", quick_subset([0, 1, 3], keep={0, 3}))
def test_gemma3n_matrix_free_equals_dense(layer):
    """Every stream: the library's dense Jacobian [96, 96] of a block (0: sliding attention
    and top-k sparsity; 3: keys and values reused from layer 1) = jacfwd of the real block on
    the state [streams, 1, pos, d] rebuilt by hand; the matrix-free top-k = numpy's eig."""
    from tests.oracles import recorded_block

    probe = _float64_probe("gemma3n_text")
    block, call, H0 = recorded_block(probe, layer, 0)
    p = H0.shape[0] - 1

    def f(x):
        H = torch.cat([H0[:p], x[None], H0[p + 1:]], 0)
        state = H.reshape(1, len(H), 3, 32).permute(2, 0, 1, 3).contiguous()
        return _streams_as_tokens(block_output(block, call, state))[0, p]

    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        want = torch.func.jacfwd(f)(H0[p])
    op = block_jacobian(probe.anatomy, probe.recording, layer)
    got = op.to_dense()
    assert got.shape == (96, 96)
    assert float((got - want).abs().max()) <= 1e-10 * float(want.abs().max())
    result = eigs(op, 4, tol=1e-10, seed=0, return_vectors=False)
    assert bool(result.converged)
    exact = eigvals_by_modulus(np.asarray(want))[:len(result.values)]
    assert_same_spectrum(np.asarray(result.values), exact, 1e-8)


def test_gemma3n_steering_needs_a_layer_with_its_own_values():
    model = make("gemma3n_text", dtype=torch.float32)
    u = torch.randn(32, generator=torch.Generator().manual_seed(0))
    with pytest.raises(MissingWeightsError, match=r"layer 3: its attention reuses an earlier "
                                                  r"layer's keys and values \(KV sharing\)"):
        with sh.steer(model, u, gap=0.1):
            pass
    before = model.layers[1].self_attn.o_proj.weight.clone()
    with sh.steer(model, u, layer=1, gap=0.1):
        assert not torch.equal(model.layers[1].self_attn.o_proj.weight, before)
    assert torch.equal(model.layers[1].self_attn.o_proj.weight, before)


GEMMA4_KINDS = [("gqa", "routed+shared"), ("mqa", "routed+shared")] * 2


def test_gemma4_is_recorded_exactly_and_analysed():
    """Sliding layers (head size 8, 2 key/value heads) and full ones (head size 16 and one
    key/value head, read from each layer: the config refuses to state them), keys = values on
    the full layers, KV sharing (layers 2-3), routed experts beside the dense MLP, in the
    user's float32 with HF's default experts kernels: the forward is bit-identical, the
    recording is the model's own hidden states, the power view covers layers 0-1 and says why
    2-3 have no rows, the Jacobian view covers all four blocks with no fallback."""
    model = make("gemma4_text", dtype=torch.float32)
    anatomy = sh.anatomy_of(model)
    assert anatomy.family == "gemma4"
    assert [(p.mixer, p.mlp) for p in anatomy.layers] == GEMMA4_KINDS
    assert [p.has_ov_map for p in anatomy.layers] == [True, True, False, False]
    assert [tuple(p.value_weights().shape) for p in anatomy.layers[:2]] == [(4, 8, 32),
                                                                         (4, 16, 32)]
    batch, out, probe = _recorded_bit_identically(model)
    real, rec = batch["attention_mask"].bool(), probe.recording
    for layer in range(4):
        assert torch.equal(rec.resid_pre[layer][real], out.hidden_states[layer][real])
        if layer < 3:  # the last hidden state is normalised
            assert torch.equal(rec.resid_post[layer][real], out.hidden_states[layer + 1][real])
    report = _check_kv_sharing_analysis(probe, "v_norm")
    assert report.metadata["layer_mixers"] == [m for m, _ in GEMMA4_KINDS]


def test_gemma4_F_equals_a_fit_of_the_raw_modules():
    """F = W_O W_V with each layer's own head size: layer 0 through v_proj, layer 1 (keys are
    values) through k_proj, both with the values' RMS norm (no gain) taken out; the
    KV-sharing layers have none (NaN)."""
    model = make("gemma4_text")
    anatomy = sh.anatomy_of(model)
    F_lib = sh.layer_matrices(model)
    for part, value_in in zip(anatomy.layers[:2], ("self_attn.v_proj", "self_attn.k_proj")):
        norm = part.block.self_attn.v_norm
        norm.forward = lambda x: x
        try:
            want = oracle_F(model, part.block, value_in, "self_attn.o_proj", 32)
        finally:
            del norm.forward
        torch.testing.assert_close(F_lib[part.index], want, rtol=1e-6, atol=1e-6)
    assert torch.isnan(F_lib[2:]).all()


@pytest.mark.filterwarnings("ignore::spectral_hooks.errors.GenericAnatomyWarning")
def test_a_config_whose_head_sizes_differ_by_layer_is_read_per_layer():
    """transformers raises on ``config.head_dim`` of a heterogeneous config: the family and
    the generic fallback read each layer's head size and key/value heads from its module."""
    from spectral_hooks.anatomy.generic import generic_anatomy

    model = make("gemma4_text")
    with pytest.raises(RuntimeError, match="per-layer attribute"):
        model.config.head_dim  # noqa: B018 - the read transformers refuses
    for anatomy in (sh.anatomy_of(model), generic_anatomy(model)):
        assert tuple(anatomy.layers[0].output_weights().shape) == (4, 32, 8)
        assert (anatomy.n_kv_heads, anatomy.d_head) == (2, 8)  # the first layer's
    assert tuple(sh.anatomy_of(model).layers[1].output_weights().shape) == (4, 32, 16)


@pytest.mark.parametrize("name, family, wrapper, causal_lm", [
    ("gemma3n_text", "GEMMA3N", "Gemma3nConfig", "Gemma3nForCausalLM"),
    ("gemma4_text", "GEMMA4", "Gemma4Config", "Gemma4ForCausalLM"),
    ("qwen3_5_text", "QWEN3_NEXT", "Qwen3_5Config", "Qwen3_5ForCausalLM")])
def test_a_multimodal_wrapper_is_refused_in_one_line(name, family, wrapper, causal_lm):
    import transformers as tf

    from spectral_hooks.anatomy import hybrid
    from spectral_hooks.anatomy.hf import build

    model = make(name, dtype=torch.float32)
    model.config = getattr(tf, wrapper)(text_config=model.config.to_dict())  # the wrapper's
    with pytest.raises(UnsupportedModelError, match=f"language model alone.*{causal_lm}") \
            as caught:
        build(model, getattr(hybrid, family))
    assert "\n" not in str(caught.value)


def test_steering_a_hybrid_whose_last_layer_has_no_attention_is_refused_clearly():
    model = make("mamba2", dtype=torch.float32)
    u = torch.randn(32)
    with pytest.raises(UnsupportedModelError, match="layer 1 is a state_space mixer"):
        with sh.steer(model, u, gap=0.1):
            pass


def test_a_block_no_replay_can_run_ends_in_one_library_error():
    """Without the experts switch (an anatomy registered without a replay context), gpt-oss's
    grouped-matmul experts have no float64 kernel: linearize, jvp and finite differences all
    fail, and the chain ends in an UnsupportedModelError naming the layer, the block and what
    to do, not in torch's RuntimeError."""
    from spectral_hooks.anatomy.calls import HF_CALLS

    model = make("gpt_oss", dtype=torch.float32)
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_batch())
    anatomy = probe.anatomy.replace(call_convention=HF_CALLS)
    with pytest.warns(sh.errors.FallbackWarning), \
            pytest.raises(UnsupportedModelError, match=r"layer 0 \(GptOssDecoderLayer\) cannot "
                          r"be linearised: .*float64.*register_anatomy"):
        block_jacobian(anatomy, probe.recording, 0).matvec(torch.randn(32, dtype=torch.float64))


class _Experts(torch.nn.Module):
    """Two linear experts; ``forward(x, index)`` applies each token's chosen one."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(1)))

    def forward(self, x, index):
        return torch.einsum("tij,tj->ti", self.w[index[:, 0]], x)


class _RoutedMlp(torch.nn.Module):
    """Top-1 routing on x[0] + x[1] * (0, 0, 1): experts 1 and 2 tie in float32 whenever
    x[1] is below float32's resolution at x[0], and expert 2 wins in float64."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Parameter(torch.tensor([[-9.0, 0.0], [1.0, 0.0], [1.0, 1.0]]))
        self.experts = _Experts()

    def forward(self, x):
        flat = x.reshape(-1, 8)
        _, index = torch.topk(flat[:, :2] @ self.gate.T, 1, dim=-1)
        return self.experts(flat, index).reshape(x.shape)


class _RoutedBlock(torch.nn.Module):
    """Attention (tests/families/test_generic.py's, d = 8), then the routed MLP."""

    def __init__(self) -> None:
        super().__init__()
        from tests.families.test_generic import Attention

        self.attn, self.mlp = Attention(causal=True), _RoutedMlp()

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class _RoutedStack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from types import SimpleNamespace

        self.config = SimpleNamespace(hidden_size=8, num_attention_heads=2)
        self.blocks = torch.nn.ModuleList([_RoutedBlock()])

    def forward(self, inputs_embeds):
        return self.blocks[0](inputs_embeds)


def test_a_routing_flip_between_the_model_dtype_and_the_replay_is_held_at_the_recorded_choice():
    """The float32 forward ties experts 1 and 2 (and picks one); the float64 replay would pick
    expert 2. The recorded choice is held: with the attention adding nothing, the block is
    x + W_e x at each token, so its token Jacobian is I + W_e of the recorded expert e (the
    oracle: the expert weights, and the expert the float32 forward itself picked)."""
    torch.manual_seed(0)
    model = _RoutedStack().eval()
    for p in model.blocks[0].attn.parameters():
        torch.nn.init.zeros_(p)  # attention adds nothing: the block input reaches the router
    x = torch.zeros(1, 3, 8)
    x[0, :, 0] = 1.0
    x[0, :, 1] = 1e-9  # below float32's resolution at 1.0
    mlp = model.blocks[0].mlp
    with torch.no_grad():
        recorded = int(torch.topk(x[0, -1:, :2] @ mlp.gate.T, 1).indices)
        replayed = int(torch.topk(x[0, -1:, :2].double() @ mlp.gate.T.double(), 1).indices)
    assert (recorded, replayed) == (1, 2)  # the tie and its float64 break
    with pytest.warns(sh.errors.GenericAnatomyWarning), sh.instrument(model) as probe, \
            torch.no_grad():
        model(inputs_embeds=x)
    assert probe.anatomy.layers[0].mlp == "routed"
    with pytest.warns(sh.errors.FallbackWarning, match=r"would route positions \[0, 1, 2\] to "
                                                        r"other experts.*recorded choice is held"):
        op = block_jacobian(probe.anatomy, probe.recording, 0)
    want = torch.eye(8, dtype=torch.float64) + mlp.experts.w[recorded].detach().double()
    torch.testing.assert_close(op.to_dense(), want, rtol=0, atol=1e-12)
    assert op.single_query_mode is None  # the whole sequence, the choice held
