"""Hook lifecycle: exact removal, bit-identical outputs, training, generate, padding, errors."""

import pytest
import torch
from torch import nn

import spectral_hooks as sh
from spectral_hooks.hooks.taps import count_hook_points as count_hooks
from tests.tiny_models import make_model


def test_outputs_bit_identical_and_handles_removed():
    model = make_model("llama", dtype=torch.float32)
    ids = torch.randint(0, 100, (3, 7))
    with torch.no_grad():
        before = model(ids).last_hidden_state
        probe = sh.instrument(model)
        assert count_hooks(model) == probe.n_handles > 0
        during = model(ids).last_hidden_state
        probe.remove()
        probe.remove()  # idempotent
        after = model(ids).last_hidden_state
    assert torch.equal(before, during) and torch.equal(before, after)
    assert count_hooks(model) == 0 and not probe.attached


def test_exception_inside_forward_leaves_no_handle():
    model = make_model("gpt2")
    boom = model.h[1].register_forward_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(RuntimeError):
        with sh.instrument(model):
            model(torch.randint(0, 100, (1, 3)))
    boom.remove()
    assert count_hooks(model) == 0


def test_hundred_cycles_and_foreign_hooks_survive():
    model = make_model("gpt2")
    seen = []
    foreign = model.h[0].register_forward_hook(lambda m, a, o: seen.append(1))
    foreign_pre = model.register_forward_pre_hook(lambda m, a: None)
    for _ in range(100):
        sh.instrument(model).remove()
    assert count_hooks(model) == 2
    with sh.instrument(model):
        model(torch.randint(0, 100, (1, 3)))
    assert count_hooks(model) == 2 and seen == [1]
    foreign.remove(), foreign_pre.remove()


def test_no_grad_inference_mode_and_training_backward():
    model = make_model("gpt2", dtype=torch.float32)
    ids = torch.randint(0, 100, (2, 5))
    with sh.instrument(model) as probe:
        with torch.inference_mode():
            model(ids)
        with torch.no_grad():
            model(ids)
        model.train()
        loss = model(ids).last_hidden_state.pow(2).mean()
        loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert probe.recording.n_samples == 6 and len(probe.recording.steps) == 3
    assert not probe.recording.resid_post[0].requires_grad


def test_gradients_unchanged_by_probe():
    model = make_model("llama", dtype=torch.float64)
    ids = torch.randint(0, 100, (2, 5))

    def grads():
        model.zero_grad()
        model(ids).last_hidden_state.sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    with sh.instrument(model):
        hooked = grads()
    assert all(torch.equal(a, b) for a, b in zip(plain, hooked))


def test_gradient_checkpointing_records_once():
    model = make_model("llama", dtype=torch.float32, wrapper=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, 100, (2, 5))
    with sh.instrument(model) as probe:
        model(ids, labels=ids).loss.backward()
    assert len(probe.recording.steps) == 1
    assert probe.recording.resid_pre[1].shape == (2, 5, 32)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_generate_records_prefill_and_each_decode_step(family):
    model = make_model(family, dtype=torch.float32, wrapper=True)
    ids = torch.randint(0, 100, (2, 4))
    with sh.instrument(model) as probe, torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                             do_sample=False, pad_token_id=0)
    rec = probe.recording
    n_new = out.shape[1] - ids.shape[1]
    assert [s.step for s in rec.steps] == list(range(n_new))
    assert [s.n_positions for s in rec.steps] == [4] + [1] * (n_new - 1)
    assert rec.resid_post[0].shape == (2, 4 + n_new - 1, 32)
    assert rec.position_step[0].tolist() == [0, 0, 0, 0] + list(range(1, n_new))
    assert rec.steps[0].replayable and not rec.steps[1].replayable
    # the decode-step recordings equal a plain forward over the same tokens
    with torch.no_grad():
        full = model(out[:, :-1], output_hidden_states=True).hidden_states
    torch.testing.assert_close(rec.resid_pre[1], full[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family,side", [("gpt2", "left"), ("llama", "left"), ("bert", "right")])
def test_padding_matches_unpadded_runs(family, side):
    model = make_model(family, dtype=torch.float64)
    lengths = [5, 3, 4]
    seqs = [torch.randint(1, 100, (n,)) for n in lengths]
    width = max(lengths)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        sl = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, sl], mask[i, sl] = s, 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with sh.instrument(model) as probe, torch.no_grad():
        model(ids, attention_mask=mask, position_ids=position_ids)
    padded = probe.recording
    assert torch.equal(padded.mask, mask)
    with sh.instrument(model) as single, torch.no_grad():
        for s in seqs:
            model(s[None])
    for layer in range(sh.anatomy_of(model).n_layers):
        for capture in ("resid_pre", "resid_post", "attn_out"):
            torch.testing.assert_close(padded.tokens(capture, layer),
                                       single.recording.tokens(capture, layer),
                                       rtol=1e-9, atol=1e-9)


def test_runs_of_different_lengths_are_padded_with_mask():
    model = make_model("gpt2")
    with sh.instrument(model, layers=[-1], capture=["resid_post"]) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 3)))
        model(torch.randint(0, 100, (2, 5)))
    rec = probe.recording
    assert rec.resid_post[-1].shape == (3, 5, 32)
    assert rec.mask.tolist()[0] == [1, 1, 1, 0, 0]
    assert rec.tokens("resid_post", 1).shape == (13, 32)
    assert torch.equal(rec["blocks.1.hook_resid_post"], rec.resid_post[1])
    with pytest.raises(KeyError, match="not recorded"):
        rec.resid_post[0]
    with pytest.raises(KeyError, match="not captured"):
        rec.resid_pre[1]


def test_store_cpu_and_stats():
    model = make_model("gpt2", dtype=torch.float64)
    batches = [torch.randint(0, 100, (2, 6)) for _ in range(3)]
    with sh.instrument(model, store="stats") as stats_probe, torch.no_grad():
        for b in batches:
            model(b)
    with sh.instrument(model, store="cpu", dtype=torch.float32) as cpu_probe, torch.no_grad():
        for b in batches:
            model(b)
    assert cpu_probe.recording.resid_post[0].dtype == torch.float32
    tokens = torch.cat([cpu_probe.recording.tokens("resid_post", 1).double()])
    st = stats_probe.recording.stats("resid_post", 1)
    assert st.count == 36
    torch.testing.assert_close(st.mean, tokens.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(st.cov, torch.cov(tokens.T), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="running statistics"):
        stats_probe.recording.resid_post[0]
    # memory stays flat: only the latest run's call is kept, every call is counted
    assert stats_probe.recording.n_calls == cpu_probe.recording.n_calls == 3
    assert [s.index for s in stats_probe.recording.steps] == [2]
    assert [s.index for s in cpu_probe.recording.steps] == [0, 1, 2]


def test_block_input_replays_the_block():
    model = make_model("llama")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (2, 5)))
    rec = probe.recording
    for sample in range(2):
        call = rec.block_input(1, sample)
        args, kwargs = call.with_hidden(call.hidden)
        with torch.no_grad():
            out = probe.anatomy.layers[1].block(*args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        torch.testing.assert_close(out, rec.resid_post[1][sample:sample + 1], rtol=0, atol=1e-12)
    assert "cache" not in call.kwargs


def test_bad_input_errors():
    with pytest.raises(TypeError, match="nn.Module"):
        sh.instrument("gpt2")
    with pytest.raises(ValueError, match="does not look like a transformer"):
        sh.instrument(nn.Sequential(nn.Linear(3, 3), nn.ReLU()))
    model = make_model("gpt2")
    with pytest.raises(ValueError, match="out of range"):
        sh.instrument(model, layers=[99])
    with pytest.raises(ValueError, match="capture=.*resid_mid"):
        sh.instrument(model, capture=["resid_mid"])
    with pytest.raises(ValueError, match="store"):
        sh.instrument(model, store="disk")
    with sh.instrument(model) as probe:
        with pytest.raises(ValueError, match="empty batch"):
            model(torch.zeros(0, 4, dtype=torch.long))
        with pytest.raises(ValueError, match="nothing recorded"):
            probe.recording.mask
    assert count_hooks(model) == 0


def test_register_anatomy_for_an_unknown_model():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mix = nn.Linear(4, 4)

        def forward(self, x):
            return x + self.mix(x)

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.stack = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for b in self.stack:
                x = b(x)
            return x

    def builder(model):
        if not isinstance(model, Tiny):
            return None
        from spectral_hooks.anatomy import Anatomy, LayerParts
        layers = tuple(LayerParts(index=i, block=b, attention=b.mix, attn_out_module=b.mix)
                       for i, b in enumerate(model.stack))
        return Anatomy(family="tiny", model=model, layers=layers, d_model=4, n_heads=1,
                       n_kv_heads=1, d_head=4, causal=False, norm_placement="pre",
                       call_root=model)

    sh.register_anatomy("tiny", builder)
    model = Tiny()
    x = torch.randn(2, 3, 4)
    with sh.instrument(model) as probe:
        y = model(x)
    torch.testing.assert_close(probe.recording.resid_post[1], y.detach())
    with pytest.raises(ValueError, match="no attention value projection"):
        probe.anatomy.layers[0].value_weights()


def test_jacobian_replays_are_not_recorded_while_attached():
    model = make_model("gpt2")
    with sh.instrument(model) as probe:
        with torch.no_grad():
            model(torch.randint(0, 100, (1, 5)))
        before = probe.recording.resid_post[1].clone()
        J = probe.jacobian(1)
        J.matvec(torch.randn(32, dtype=torch.float64))
        J.rmatvec(torch.randn(32, dtype=torch.float64))
        probe.dense_jacobian(0)
        assert len(probe.recording.steps) == 1
        assert torch.equal(probe.recording.resid_post[1], before)


def test_blocks_called_without_the_model_forward_are_recorded_implicitly():
    """TL3's generate() calls forward() directly; the same path covers any caller that runs
    the blocks in order without the model's own forward hooks firing."""
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        h = torch.randn(1, 4, 32, dtype=torch.float64)
        for block in model.h:
            h = block(h)
    assert len(probe.recording.steps) == 1
    torch.testing.assert_close(probe.recording.resid_post[1], h)


def test_dtype_casts_floating_tensors_only_and_replay_keeps_the_mask():
    model = make_model("llama")
    ids = torch.randint(1, 100, (2, 6))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with sh.instrument(model, dtype=torch.float32) as probe, torch.no_grad():
        model(ids, attention_mask=mask, position_ids=position_ids)
    rec = probe.recording
    args, kwargs = rec.model_inputs[0]
    assert kwargs["attention_mask"].dtype == torch.long and args[0].dtype == torch.long
    call = rec.block_input(0, 1)
    assert call.kwargs["position_ids"].dtype == torch.long
    a, kw = call.with_hidden(call.hidden.double())
    with torch.no_grad():
        out = probe.anatomy.layers[0].block(*a, **kw)
    out = out[0] if isinstance(out, tuple) else out
    real = mask[1].bool()
    torch.testing.assert_close(out[0, real].float(), rec.resid_post[0][1, real], rtol=1e-5,
                               atol=1e-5)


def test_partial_forward_is_not_committed_and_empty_position_step_errors():
    model = make_model("gpt2")
    probe = sh.instrument(model)
    with pytest.raises(ValueError, match="nothing recorded"):
        probe.recording.position_step
    with torch.no_grad():
        h = torch.randn(1, 4, 32, dtype=torch.float64)
        model.h[0](h)  # only the first block: an implicit call that never completes
        model(torch.randint(0, 100, (1, 4)))
    assert len(probe.recording.steps) == 1
    probe.remove()


def test_a_forward_that_bypasses_the_models_hooks_is_recorded_and_its_end_hook_is_lazy():
    """``model.forward(...)`` skips the hooks on the model itself (sentence-transformers does
    this): the blocks' hooks record the call, and the hook that ends such a call is added to
    the last block only when the first one runs, once, and removed with the rest."""
    model = make_model("gpt2", dtype=torch.float32)
    ids = torch.randint(0, 100, (2, 5))
    with torch.no_grad():
        expected = model(ids).last_hidden_state
        probe = sh.instrument(model)
        n = probe.n_handles
        assert count_hooks(model) == n
        model(ids)  # through the model's hooks: no end-of-implicit-call hook needed
        assert probe.n_handles == count_hooks(model) <= n
        n = probe.n_handles
        for _ in range(2):
            out = model.forward(ids).last_hidden_state
        assert torch.equal(out, expected)
        assert probe.n_handles == count_hooks(model) == n + 1
        rec = probe.recording
        assert rec.n_calls == 3
        for layer in range(len(probe.anatomy.layers)):  # the same inputs: the same states
            for point in ("resid_pre", "resid_post", "attn_out"):
                states = rec.tensor(point, layer)
                assert torch.equal(states[2:4], states[:2]) and torch.equal(states[4:], states[:2])
        probe.remove()
        assert count_hooks(model) == 0
        probe.attach()
        probe.clear()
        model.forward(ids)
        assert probe.recording.n_calls == 1
        probe.remove()
    assert count_hooks(model) == 0


def test_a_model_call_binder_is_read_once_per_forward_function():
    """instrument() reads the model call's signature once per class forward (issue 57); a
    forward that is not a method (a wrapper's instance attribute) is read anew, and every
    binder names the same arguments as the signature."""
    import functools
    import inspect

    from spectral_hooks.hooks.forward_call import model_call_binder

    a, b = make_model("gpt2"), make_model("gpt2", seed=1)
    assert model_call_binder(a.forward) is model_call_binder(b.forward)
    wrapped = functools.partial(a.forward)
    assert model_call_binder(wrapped) is not model_call_binder(wrapped)
    names = [p for p in inspect.signature(a.forward).parameters if p != "kwargs"]
    assert model_call_binder(a.forward).positional == tuple(names)
