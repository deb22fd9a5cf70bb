"""Taps (spectral_hooks/hooks/taps.py): the probe's per-layer points keep Module.__call__'s fast path,
and behave as the hooks they replace where it matters: what they see beside other libraries'
hooks and forwards, removal in any order, copies and pickles of an instrumented model."""

import copy
import functools
import inspect
import pickle

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.hooks.taps import ForwardTap, count_taps, is_tap_hook, taps_on
from spectral_hooks.hooks.taps import count_hook_points as count_hooks
from tests.tiny_models import make_model

IDS = torch.randint(1, 100, (2, 5), generator=torch.Generator().manual_seed(0))


def test_layers_keep_the_fast_path_and_outputs_stay_bit_identical():
    model = make_model("llama")
    with torch.no_grad():
        plain = model(IDS).last_hidden_state
        with sh.instrument(model) as probe:
            recorded = model(IDS).last_hidden_state
            hooked = [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks]
            assert hooked == [model]  # only the root carries hooks: it begins and ends a call
            assert count_taps(model) > 0 and count_hooks(model) == probe.n_handles
    assert torch.equal(plain, recorded)
    assert count_hooks(model) == 0 and "forward" not in vars(model.layers[0])


def test_a_hook_that_replaces_an_output_is_recorded_as_it_hands_it_on():
    """An intervention's output is what the next layer sees: the recording holds it, whether
    the hook was there before the probe or came after."""
    for order in ("before", "after"):
        model = make_model("gpt2")

        def zero_attention(module, args, output):
            return (torch.zeros_like(output[0]),) + tuple(output[1:])

        handle = model.h[0].attn.register_forward_hook(zero_attention) if order == "before" \
            else None
        with sh.instrument(model) as probe, torch.no_grad():
            if handle is None:
                handle = model.h[0].attn.register_forward_hook(zero_attention)
            model(IDS)
            model(IDS)  # a steady-state call too
        handle.remove()
        rec = probe.recording
        assert torch.equal(rec.attn_out[0], torch.zeros_like(rec.attn_out[0])), order
        assert count_hooks(model) == 0


def test_a_pre_hook_that_replaces_an_input_is_recorded_as_the_block_receives_it():
    model = make_model("gpt2")
    with sh.instrument(model, capture=["resid_pre"]) as probe, torch.no_grad():
        handle = model.h[1].register_forward_pre_hook(lambda m, args: (args[0] * 2.0,) + args[1:])
        out = model(IDS, output_hidden_states=True)
        handle.remove()
    torch.testing.assert_close(probe.recording.resid_pre[1], 2.0 * out.hidden_states[1],
                               rtol=0, atol=0)


def test_removal_in_any_order_under_other_taps_and_foreign_forwards():
    model = make_model("gpt2")
    block = model.h[0]

    def wrapper(forward, *args, **kwargs):  # another library's forward (accelerate does this)
        return forward(*args, **kwargs)

    theirs = functools.partial(wrapper, block.forward)
    block.forward = theirs
    first, second = sh.instrument(model), sh.instrument(model)
    with torch.no_grad():
        model(IDS)
    first.remove()  # under the second probe's taps: spliced out of the chain
    assert count_hooks(model) == second.n_handles and taps_on(block)
    second.remove()
    assert vars(block)["forward"] is theirs and count_hooks(model) == 0
    assert first.recording.n_calls == second.recording.n_calls == 1


def test_a_foreign_forward_put_on_top_leaves_a_pass_through():
    model = make_model("gpt2")
    with torch.no_grad():
        plain = model(IDS).last_hidden_state
    probe = sh.instrument(model)
    block = model.h[1]
    block.forward = functools.partial(lambda forward, *a, **k: forward(*a, **k), block.forward)
    probe.remove()
    left = vars(block)["forward"].args[0]
    assert isinstance(left, ForwardTap) and not left.attached and count_taps(model) == 0
    with torch.no_grad():
        assert torch.equal(model(IDS).last_hidden_state, plain)
    assert probe.recording.n_calls == 0


def test_signature_deepcopy_and_pickle_see_the_forward_not_the_tap():
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(IDS)
        block = model.h[0]
        assert inspect.signature(block.forward) == inspect.signature(type(block).forward.__get__(block))
        twin = copy.deepcopy(model)
        assert count_taps(twin) == 0
        with torch.no_grad():
            for p in twin.parameters():
                p.mul_(1.5)  # the twin computes with its own weights
            assert not torch.equal(twin(IDS).last_hidden_state, model(IDS).last_hidden_state)
        restored = pickle.loads(pickle.dumps(model.h[1]))
        assert count_taps(restored) == 0
        hidden = torch.randn(2, 5, 32, dtype=torch.float64)
        assert torch.equal(restored(hidden)[0], model.h[1](hidden)[0])
    assert probe.recording.n_calls == 2


class _Interrupt:
    def __call__(self, module, args, output):
        raise KeyboardInterrupt


def test_an_interrupt_in_another_hook_leaves_nothing_behind_and_records_nothing():
    """A foreign hook that raises (KeyboardInterrupt skips PyTorch's always-call hooks) after
    the module's forward: the tap's own hook after it stays only while the tap does."""
    model = make_model("gpt2")
    last = model.h[-1]
    with sh.instrument(model) as probe, torch.no_grad():
        model(IDS)
        handle = last.register_forward_hook(_Interrupt())
        with pytest.raises(KeyboardInterrupt):
            model(IDS)
        assert any(is_tap_hook(h) for h in last._forward_hooks.values())
        handle.remove()
        model(IDS)  # without the foreign hook ours goes too: the fast path again
        assert not last._forward_hooks
        assert probe.recording.n_calls == 2  # the interrupted call is not recorded
    assert count_hooks(model) == 0 and not last._forward_hooks


def test_a_hook_added_after_the_first_call_still_runs_before_the_taps_post():
    model = make_model("gpt2")
    attn = model.h[0].attn
    scale = [1.0]

    def scaled(module, args, output):
        return (output[0] * scale[0],) + tuple(output[1:])

    with sh.instrument(model, capture=["attn_out"]) as probe, torch.no_grad():
        first = attn.register_forward_hook(scaled)
        model(IDS)
        scale[0] = 0.0
        second = attn.register_forward_hook(scaled)  # registered after the tap's own hook
        model(IDS)
        first.remove(), second.remove()
    zero = probe.recording.attn_out[0][IDS.shape[0]:]
    assert torch.equal(zero, torch.zeros_like(zero))
    assert count_hooks(model) == 0


def test_a_copy_made_while_another_hook_is_there_records_nothing():
    """The tap's own hook after another library's hook is copied inert with the model."""
    model = make_model("gpt2")
    attn = model.h[0].attn
    seen = []
    handle = attn.register_forward_hook(lambda m, a, out: seen.append(1))
    with sh.instrument(model) as probe, torch.no_grad():
        model(IDS)
        assert any(is_tap_hook(h) for h in attn._forward_hooks.values())
        twin = copy.deepcopy(model)
        twin(IDS)
        assert probe.recording.n_calls == 1 and len(seen) == 2  # the twin keeps their hook
    handle.remove()
    assert count_hooks(model) == 0 and count_taps(twin) == 0
