"""TransformerLens 3 ``HookedTransformer``: recordings vs TL's own cache, F vs the raw weights,
hook lifecycle next to TL's own hooks. Runs in the TL-3 venv (``bash .ci/tl3.sh``); skipped where
TransformerLens is missing or is TL 4 (which removed HookedTransformer)."""

import pytest
import torch

pytest.importorskip("transformer_lens")
try:
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
except ImportError as exc:  # TL 4 raises ImportError for HookedTransformer
    pytest.skip(f"transformer_lens.HookedTransformer unavailable: {exc}", allow_module_level=True)

import spectral_hooks as sh
from spectral_hooks.hooks.taps import count_hook_points as count_hooks

pytestmark = pytest.mark.tl3

N_LAYERS, D_MODEL, N_HEADS, D_HEAD, D_VOCAB = 2, 32, 4, 8, 50
BASE = dict(n_layers=N_LAYERS, d_model=D_MODEL, n_heads=N_HEADS, d_head=D_HEAD, d_mlp=64,
            n_ctx=32, d_vocab=D_VOCAB, act_fn="gelu", normalization_type="LN",
            attention_dir="causal", seed=0, device="cpu")
VARIANTS = {
    "ln": {},
    "gqa": dict(n_key_value_heads=2),
    "rms_rotary": dict(normalization_type="RMS", positional_embedding_type="rotary",
                       rotary_dim=D_HEAD),
}
CAPTURES = ("resid_pre", "resid_post", "attn_out")


def make_model(variant: str) -> HookedTransformer:
    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(**{**BASE, **VARIANTS[variant]})).eval()
    # TL initialises biases to zero: give them values so a forgotten bias would show.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.split(".")[-1].startswith("b_"):
                param.normal_(0, 0.1)
    return model


def tokens(batch: int = 2, pos: int = 7, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, D_VOCAB, (batch, pos), generator=g)



@pytest.fixture(scope="module", params=list(VARIANTS))
def model(request):
    return make_model(request.param)


@pytest.fixture(scope="module")
def ln_model():
    return make_model("ln")


# ------------------------------------------------------------------ anatomy


def test_anatomy(model):
    anatomy = sh.anatomy_of(model)
    cfg = model.cfg
    assert anatomy.family == "tlens3"
    assert (anatomy.n_layers, anatomy.d_model, anatomy.n_heads, anatomy.d_head) == (
        N_LAYERS, D_MODEL, N_HEADS, D_HEAD)
    assert anatomy.n_kv_heads == (cfg.n_key_value_heads or cfg.n_heads)
    assert anatomy.causal and anatomy.norm_placement == "pre"
    for layer in anatomy.layers:
        assert layer.block is model.blocks[layer.index]
        assert layer.value_weights().shape == (N_HEADS, D_HEAD, D_MODEL)
        assert layer.output_weights().shape == (N_HEADS, D_MODEL, D_HEAD)
        assert layer.attn_norm is model.blocks[layer.index].ln1


KINDS = {"ln": "mha", "gqa": "gqa", "rms_rotary": "mha"}  # (n_key_value_heads=2 of 4: gqa)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_layer_kinds_reach_the_tables(variant):
    """Issue 54: each layer's mixer and MLP kind, in the anatomy and the tables' columns."""
    model = make_model(variant)
    assert [(p.mixer, p.mlp) for p in sh.anatomy_of(model).layers] == \
        [(KINDS[variant], "dense")] * N_LAYERS
    with sh.instrument(model) as probe, torch.no_grad():
        model(tokens())
    power = probe.analyze(progress=False).power
    assert power["mixer"].astype(str).tolist() == [KINDS[variant]] * N_LAYERS
    assert power["mlp"].astype(str).tolist() == ["dense"] * N_LAYERS


def test_moe_layers_are_routed():
    cfg = HookedTransformerConfig(**{**BASE, "num_experts": 4, "experts_per_token": 2,
                                     "gated_mlp": True, "act_fn": "silu"})
    anatomy = sh.anatomy_of(HookedTransformer(cfg))
    assert [p.mlp for p in anatomy.layers] == ["routed"] * N_LAYERS


def _raw_heads(attn, n_heads):
    """W_V [H, d_model, d_head], b_V [H, d_head] from TL's stored parameters, GQA groups expanded
    here (head h reads key/value group h // (H / n_kv), as TL's repeat_interleave does)."""
    w_v = attn._W_V if hasattr(attn, "_W_V") else attn.W_V
    b_v = attn._b_V if hasattr(attn, "_b_V") else attn.b_V
    group = torch.arange(n_heads) // (n_heads // w_v.shape[0])
    return w_v.detach()[group], b_v.detach()[group]


@pytest.mark.parametrize("layer", range(N_LAYERS))
def test_F_matches_raw_weights(model, layer):
    parts = sh.anatomy_of(model).layers[layer]
    F = sum(parts.output_weights()[h] @ parts.value_weights()[h] for h in range(N_HEADS))

    attn = model.blocks[layer].attn
    w_v, b_v = _raw_heads(attn, N_HEADS)
    w_o = attn.W_O.detach()  # [H, d_head, d_model]; TL is row-vector: x @ W_V[h] @ W_O[h]
    expected = torch.einsum("hmd,hdn->mn", w_v, w_o).T
    torch.testing.assert_close(F, expected, rtol=0, atol=1e-6)

    # the same F acting on a vector, in TL's row convention, head by head
    x = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(layer))
    row = sum((x @ w_v[h]) @ w_o[h] for h in range(N_HEADS))
    torch.testing.assert_close(F @ x, row, rtol=1e-5, atol=1e-5)

    torch.testing.assert_close(parts.value_bias(), b_v, rtol=0, atol=0)
    torch.testing.assert_close(parts.output_bias(), attn.b_O.detach(), rtol=0, atol=0)


def test_attn_norm_weight(model):
    for parts in sh.anatomy_of(model).layers:
        gain = parts.attn_norm_weight()
        assert gain is not None
        assert torch.equal(gain, model.blocks[parts.index].ln1.w.detach())


# ------------------------------------------------------------------ recordings


def _assert_matches_cache(rec, cache, layers=range(N_LAYERS)):
    for layer in layers:
        for name in CAPTURES:
            tl_name = f"blocks.{layer}.hook_{name}"
            got = getattr(rec, name)[layer]
            assert torch.equal(got, cache[tl_name]), tl_name
            assert torch.equal(rec[tl_name], cache[tl_name]), tl_name


def test_recording_matches_run_with_cache(model):
    toks = tokens()
    with sh.instrument(model) as probe, torch.no_grad():
        logits = model(toks)
    rec = probe.recording
    with torch.no_grad():
        ref_logits, cache = model.run_with_cache(toks)
    assert torch.equal(logits, ref_logits)
    _assert_matches_cache(rec, cache)
    assert rec["blocks.1.hook_resid_post"].shape == (2, 7, D_MODEL)
    assert torch.equal(rec.mask, torch.ones(2, 7, dtype=torch.long))
    assert len(rec.steps) == 1 and rec.steps[0].n_positions == 7
    for layer in range(N_LAYERS):
        assert not rec.resid_post[layer].requires_grad


def test_recording_during_run_with_cache(model):
    """Our hooks and TL's caching hooks on the same forward; TL's cleanup keeps ours."""
    toks = tokens(seed=2)
    with sh.instrument(model) as probe, torch.no_grad():
        _, cache = model.run_with_cache(toks)
        assert probe.n_handles and count_hooks(model) == probe.n_handles
        _assert_matches_cache(probe.recording, cache)
    assert count_hooks(model) == 0


def test_recording_with_grad_is_detached(ln_model):
    toks = tokens(seed=3)
    with sh.instrument(ln_model) as probe:
        loss = ln_model(toks, return_type="loss")
        loss.backward()
    ln_model.zero_grad(set_to_none=True)
    rec = probe.recording
    _, cache = ln_model.run_with_cache(toks)
    assert all(not rec.resid_pre[l].requires_grad for l in range(N_LAYERS))
    torch.testing.assert_close(rec.resid_post[1], cache["blocks.1.hook_resid_post"],
                               rtol=0, atol=1e-6)


def test_layer_subset_and_capture(ln_model):
    toks = tokens()
    with sh.instrument(ln_model, layers=[-1], capture=("resid_post",)) as probe:
        ln_model(toks)
    _, cache = ln_model.run_with_cache(toks)
    assert probe.recording.layers == (1,)
    assert torch.equal(probe.recording.resid_post[1], cache["blocks.1.hook_resid_post"])
    with pytest.raises(KeyError):
        probe.recording.resid_post[0]
    with pytest.raises(KeyError):
        probe.recording.attn_out[1]


def test_outputs_bit_identical(model):
    toks = tokens(seed=4)
    with torch.no_grad():
        plain = model(toks)
        with sh.instrument(model):
            probed = model(toks)
        after = model(toks)
    assert torch.equal(plain, probed) and torch.equal(plain, after)


def test_padded_batch_mask(ln_model):
    """An explicit attention_mask reaches the recording's mask."""
    toks = tokens(batch=2, pos=6)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    with sh.instrument(ln_model) as probe, torch.no_grad():
        ln_model(toks, attention_mask=mask)
    assert torch.equal(probe.recording.mask, mask)
    assert probe.recording.tokens("resid_post", 0).shape == (10, D_MODEL)


# ------------------------------------------------------------------ lifecycle


def test_zero_hooks_after_remove(model):
    assert count_hooks(model) == 0
    probe = sh.instrument(model)
    assert count_hooks(model) == probe.n_handles > 0
    probe.remove()
    probe.remove()  # twice is fine
    assert count_hooks(model) == 0
    for _ in range(20):
        sh.instrument(model).remove()
    assert count_hooks(model) == 0


def test_zero_hooks_after_exception_in_forward(ln_model):
    def boom(tensor, hook):
        raise RuntimeError("boom inside the forward")

    ln_model.add_hook("blocks.1.hook_resid_mid", boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            with sh.instrument(ln_model):
                ln_model(tokens())
        probe = sh.instrument(ln_model)
        with pytest.raises(RuntimeError, match="boom"):
            ln_model(tokens())
    finally:
        ln_model.reset_hooks()
    assert count_hooks(ln_model) == probe.n_handles
    # the aborted call left no half-recorded state: the next forward records cleanly
    toks = tokens(seed=5)
    with torch.no_grad():
        ln_model(toks)
    probe.remove()
    assert count_hooks(ln_model) == 0
    assert len(probe.recording.steps) == 1
    _, cache = ln_model.run_with_cache(toks)
    _assert_matches_cache(probe.recording, cache)


def test_tl_hook_survives_our_remove(ln_model):
    seen = []
    ln_model.add_hook("blocks.0.hook_resid_post", lambda t, hook: seen.append(hook.name))
    try:
        assert count_hooks(ln_model) == 1
        probe = sh.instrument(ln_model)
        ln_model(tokens())
        probe.remove()
        assert count_hooks(ln_model) == 1
        ln_model(tokens())
        assert seen == ["blocks.0.hook_resid_post"] * 2
    finally:
        ln_model.reset_hooks()
    assert count_hooks(ln_model) == 0


@pytest.mark.parametrize("including_permanent", [False, True])
def test_our_hooks_survive_tl_reset_hooks(ln_model, including_permanent):
    probe = sh.instrument(ln_model)
    try:
        ln_model.add_hook("blocks.0.hook_resid_post", lambda t, hook: None, is_permanent=True)
        ln_model.add_hook("blocks.1.hook_attn_out", lambda t, hook: None)
        ln_model.reset_hooks(including_permanent=including_permanent)
        assert count_hooks(ln_model) == probe.n_handles + (0 if including_permanent else 1)
        with ln_model.hooks(fwd_hooks=[("blocks.0.hook_attn_out", lambda t, hook: None)]):
            pass  # TL's hooks() context also resets hooks on exit
        with torch.no_grad():
            _, cache = ln_model.run_with_cache(tokens(seed=6))  # recorded by the probe too
        assert len(probe.recording.steps) == 1
        _assert_matches_cache(probe.recording, cache)
    finally:
        probe.remove()
        ln_model.reset_hooks(including_permanent=True)
    assert count_hooks(ln_model) == 0


# ------------------------------------------------------------------ bad input


def test_bad_layers(ln_model):
    with pytest.raises(ValueError, match="99"):
        sh.instrument(ln_model, layers=[99])
    with pytest.raises(ValueError):
        sh.instrument(ln_model, layers=[-3])
    with pytest.raises(ValueError, match="capture"):
        sh.instrument(ln_model, capture=("resid_mid",))
    assert count_hooks(ln_model) == 0


def test_empty_batch(ln_model):
    with pytest.raises(ValueError, match="empty"):
        with sh.instrument(ln_model):
            ln_model(torch.zeros(1, 0, dtype=torch.long))
    assert count_hooks(ln_model) == 0


# ------------------------------------------------------------------ KV cache / generate


def test_generate_records_every_step(ln_model):
    with sh.instrument(ln_model) as probe:
        ln_model.generate(tokens(), max_new_tokens=3, use_past_kv_cache=True, verbose=False,
                          do_sample=False, stop_at_eos=False)
    steps = probe.recording.steps
    assert [s.step for s in steps] == [0, 1, 2]
    assert [s.n_positions for s in steps] == [7, 1, 1]


def test_prefill_with_fresh_kv_cache_is_a_new_run(ln_model):
    toks = tokens()
    with sh.instrument(ln_model) as probe, torch.no_grad():
        for _ in range(2):
            cache = TransformerLensKeyValueCache.init_cache(ln_model.cfg, "cpu", batch_size=2)
            ln_model(toks, past_kv_cache=cache, attention_mask=torch.ones_like(toks))
            step = tokens(pos=1, seed=9)
            ln_model(step, past_kv_cache=cache, attention_mask=torch.ones_like(step))
    rec = probe.recording
    assert [(s.run, s.step) for s in rec.steps] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert rec.n_samples == 4
    rec.block_input(0)  # the prefill is replayable
