"""Calls recorded by reference are committed when the recording is next read (probe.py
``_defer_commit``, hooks/forward_call.py ``DeferredCommit``): what they record equals what a probe
that copies at once records, they hold no KV cache, and an in-place write to a recorded state
drops the call with a warning instead of recording a wrong number."""

import gc
import logging
import weakref

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import RecordingError
from spectral_hooks.probe import Probe
from tests.tiny_models import make_model

CAPTURES = ("resid_pre", "resid_post", "attn_out")


def _batches():
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(1, 100, shape, generator=gen) for shape in [(2, 6), (1, 4), (3, 6)]]
    masks = [torch.ones_like(i) for i in ids]
    masks[2][0, :2] = 0  # a padded row
    return list(zip(ids, masks))


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "gemma3", "albert"])
def test_calls_recorded_by_reference_equal_copies(family):
    """The first call is stored by copies (the probe has not yet seen a call end without an
    in-place write); later ones are deferred. A store="cpu" probe never defers."""
    model = make_model(family)
    deferred, copied = sh.instrument(model), sh.instrument(model, store="cpu")
    pending = []
    with torch.no_grad():
        for ids, mask in _batches():
            model(ids, attention_mask=mask)
            pending.append(len(deferred.recording._pending))
    deferred.remove(), copied.remove()
    assert pending == [0, 1, 2]  # the path under test ran: calls 2 and 3 waited for a read
    ref, cpy = deferred.recording, copied.recording
    assert ref.n_calls == cpy.n_calls == 3 and ref.steps == cpy.steps
    for what in ("mask", "token_ids", "position_step"):
        assert torch.equal(getattr(ref, what), getattr(cpy, what)), what
    for capture in CAPTURES:
        for layer in ref.layers:
            assert torch.equal(ref.tensor(capture, layer), cpy.tensor(capture, layer))
    for sample in range(ref.n_samples):
        a, b = ref.block_input(1, sample), cpy.block_input(1, sample)
        assert torch.equal(a.hidden, b.hidden)
        assert sorted(a.kwargs) == sorted(b.kwargs)
        args, kwargs = a.with_hidden(a.hidden)
        with torch.no_grad():
            out = deferred.anatomy.layers[1].block(*args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        # one sample alone runs other BLAS kernels than the batch did on some CPUs (AMD EPYC,
        # OpenBLAS/MKL blocking by row count): equal to float64 rounding, not bit for bit
        recorded = ref.resid_post[1][sample:sample + 1, :out.shape[1]]
        torch.testing.assert_close(out, recorded, rtol=1e-12, atol=1e-12)


def test_a_deferred_call_holds_no_kv_cache():
    model = make_model("llama", dtype=torch.float32)
    ids = torch.randint(1, 100, (1, 5))
    probe = sh.instrument(model)
    with torch.no_grad():
        model(ids)  # stored by copies
        out = model(ids, use_cache=True)  # deferred
    assert len(probe.recording._pending) == 1
    cache = weakref.ref(out.past_key_values)
    del out
    gc.collect()
    assert cache() is None
    assert probe.recording.n_calls == 2 and "cache" not in probe.recording.block_input(0, 1).kwargs
    probe.remove()


def test_closing_a_call_drops_its_caches_by_name_and_by_position():
    """A pending call is only closed (its layers are given at commit): the caches go from the
    block calls the steady path noted, passed under a cache keyword or by position; the other
    arguments stay, and the commit still drops a cache passed under any other name."""
    from transformers import DynamicCache

    from spectral_hooks.hooks.forward_call import ForwardCall
    from spectral_hooks.recording.block_call import kept_block_kwargs

    cache, mask = DynamicCache(), torch.ones(1, 4)
    call = ForwardCall(None, continues=False)
    hidden = torch.zeros(1, 4, 8)
    call.noted_blocks = [
        (None, hidden, 0, (hidden,), {"past_key_values": cache, "attention_mask": mask}),
        (None, hidden, 0, (hidden, cache, mask), {"use_cache": True}),
        (None, hidden, 0, (hidden,), {"odd_name": cache}),
    ]
    call.close()
    first, second, third = call.noted_blocks
    assert first[4] == {"attention_mask": mask}
    assert second[3] == (hidden, None, mask) and second[4] == {"use_cache": True}
    assert third[4] == {"odd_name": cache} and kept_block_kwargs(third[4]) == {}


def test_a_write_after_the_call_drops_it_with_a_warning(caplog):
    """BERT returns its last block's output itself: writing to it after the call would change
    a state recorded by reference."""
    model = make_model("bert")
    ids = torch.randint(1, 100, (1, 5))
    probe = sh.instrument(model, capture=["resid_post"])
    with torch.no_grad():
        first = model(ids).last_hidden_state.clone()
        model(ids).last_hidden_state.add_(1.0)  # deferred, then written
    with caplog.at_level(logging.WARNING, logger="spectral_hooks"):
        assert probe.recording.n_calls == 1
    assert "written in place" in caplog.text
    assert torch.equal(probe.recording.resid_post[-1], first)
    with torch.no_grad():  # copies from now on: a later write changes nothing recorded
        model(ids).last_hidden_state.add_(1.0)
    assert probe.recording.n_calls == 2 and not probe.recording._pending
    assert torch.equal(probe.recording.resid_post[-1][1:], first)
    probe.remove()


def test_a_write_inside_the_forward_drops_the_call_and_copies_from_then_on(caplog):
    model = make_model("gpt2")
    ids = torch.randint(1, 100, (1, 5))
    probe = sh.instrument(model, capture=["resid_pre"])
    with torch.no_grad():
        clean = model(ids, output_hidden_states=True).hidden_states[1].clone()
        # a hook inside block 1 doubles the block's input in place after the probe noted it
        handle = model.h[1].ln_1.register_forward_pre_hook(lambda m, args: args[0].mul_(2.0))
        model(ids)
        with caplog.at_level(logging.WARNING, logger="spectral_hooks"):
            assert probe.recording.n_calls == 1
        assert "written in place" in caplog.text
        model(ids)  # copies now: the copy is taken before the write
        handle.remove()
    torch.testing.assert_close(probe.recording.resid_pre[1][1:], clean, rtol=0, atol=0)
    probe.remove()


def test_clear_forgets_deferred_calls():
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        for _ in range(3):
            model(torch.randint(1, 100, (1, 4)))
        probe.clear()
        assert probe.recording.n_calls == 0 and not probe.recording._pending
        model(torch.randint(1, 100, (2, 4)))
    assert probe.recording.n_calls == 1 and probe.recording.resid_post[0].shape == (2, 4, 32)


def test_calls_under_autograd_are_not_deferred():
    """A pending call would hold the autograd graph (and HF Trainer deep-copies callbacks)."""
    model = make_model("gpt2", dtype=torch.float32)
    ids = torch.randint(1, 100, (1, 4))
    with sh.instrument(model) as probe:
        for _ in range(3):
            model(ids).last_hidden_state.sum().backward()
        assert not probe.recording._pending
        assert not any(t.requires_grad for t in probe.recording.resid_post)


def test_suspension_skips_this_thread_only():
    """Blocks run inside ``suspended()`` (a replay) are not recorded; a suspension open on
    another thread leaves this thread's forward recorded, with the same states."""
    import threading

    from spectral_hooks.recording import suspended

    model = make_model("gpt2", dtype=torch.float32)
    ids = torch.randint(1, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    with sh.instrument(model) as probe, torch.no_grad():
        model(ids), model(ids)  # the second is deferred: the steady path
        with suspended():
            model(ids)
        assert probe.recording.n_calls == 2
        opened, done = threading.Event(), threading.Event()

        def hold() -> None:
            with suspended():
                opened.set()
                done.wait(30)

        other = threading.Thread(target=hold)
        other.start()
        try:
            assert opened.wait(30)
            model(ids)
        finally:
            done.set()
            other.join()
        rec = probe.recording
        assert rec.n_calls == 3
        for point in CAPTURES:
            for layer in range(len(probe.anatomy.layers)):
                states = rec.tensor(point, layer)
                assert torch.equal(states[4:], states[:2]) and torch.equal(states[2:4], states[:2])


def test_a_shared_block_switching_paths_mid_call_keeps_its_layer_order():
    """ALBERT applies one block at every layer. When grad turns on inside the forward (here a
    foreign hook does it at the second application), the later applications take the hooks'
    other path: every application still gets its own layer, and the states equal those of a
    call that stayed on one path."""
    model = make_model("albert", dtype=torch.float32)
    ids = torch.randint(1, 100, (2, 6), generator=torch.Generator().manual_seed(2))
    block = sh.anatomy_of(model).layers[0].block
    assert len(sh.anatomy_of(model).layers) >= 3
    seen = []

    def grad_on_at_second(module, args):
        seen.append(1)
        if len(seen) == 2:
            torch._C._set_grad_enabled(True)

    foreign = block.register_forward_pre_hook(grad_on_at_second)
    begin = model.register_forward_pre_hook(lambda *a: seen.clear())
    restore = model.register_forward_hook(lambda *a: torch._C._set_grad_enabled(False))
    try:
        with sh.instrument(model) as probe, torch.no_grad():
            for _ in range(3):
                model(ids)
            rec = probe.recording
            assert rec.n_calls == 3
            for point in CAPTURES:
                for layer in range(len(probe.anatomy.layers)):
                    states = rec.tensor(point, layer)
                    assert not states.requires_grad
                    assert torch.equal(states[4:], states[:2]) and torch.equal(states[2:4],
                                                                                states[:2])
            # the layers are distinct states, in order: layer l+1's input is layer l's output
            for layer in range(len(probe.anatomy.layers) - 1):
                assert torch.equal(rec.resid_pre[layer + 1], rec.resid_post[layer])
    finally:
        foreign.remove(), begin.remove(), restore.remove()


@pytest.mark.parametrize("store", ["device", "cpu"])
def test_a_reused_input_buffer_is_refused_at_the_replay(store):
    """The model inputs are kept by reference (the re-initialised control replays them). A
    caller that writes its input buffer in place for the next batch would make that replay
    run other inputs: ``model_inputs`` (and so ``record_on``) refuses, naming the cause. Fresh
    tensors per call replay exactly."""
    model = make_model("gpt2", dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(1, 100, (2, 6), generator=gen) for _ in range(3)]
    with sh.instrument(model, store=store) as probe, torch.no_grad():
        for ids in batches:
            model(ids.clone())
        _, fresh = probe.record_on(make_model("gpt2", dtype=torch.float32))
        assert fresh.n_calls == 3
        probe.clear()
        buffer = torch.empty_like(batches[0])
        for ids in batches:
            buffer.copy_(ids)
            model(buffer)
        with pytest.raises(RecordingError, match="written in place after the call"):
            probe.record_on(make_model("gpt2", dtype=torch.float32))
        probe.recording.to("cpu")  # already there: still the caller's buffer, still refused
        with pytest.raises(RecordingError, match="run 0 were written"):
            probe.recording.model_inputs


@pytest.mark.parametrize("family", ["gpt2", "llama", "albert"])
def test_forwards_after_the_first_take_the_steady_path(family):
    """Cost guard: in a no-grad forward after the first, every hook of the probe returns on its
    steady path (noting references): none reaches the other path (``noted``) or asks the
    thread-local suspension state, and the recording still equals the first call's."""
    import sys

    model = make_model(family, dtype=torch.float32)
    ids = torch.randint(1, 100, (2, 6), generator=torch.Generator().manual_seed(4))
    names: list = []

    def profile(frame, event, arg):
        if event == "call" and "spectral_hooks" in frame.f_code.co_filename:
            names.append(frame.f_code.co_name)

    with sh.instrument(model) as probe, torch.no_grad():
        model(ids), model(ids)
        sys.setprofile(profile)
        try:
            model(ids)
        finally:
            sys.setprofile(None)
        rec = probe.recording
        assert rec.n_calls == 3
        for point in CAPTURES:
            for layer in range(len(probe.anatomy.layers)):
                states = rec.tensor(point, layer)
                assert torch.equal(states[4:], states[:2])
    assert "hook" in names and "_end_call" in names
    assert "noted" not in names and "is_suspended" not in names, names


def _probe(model, **options) -> Probe:
    probe = sh.instrument(model, **options)
    assert isinstance(probe, Probe)  # a decoder-only model: one stack
    return probe


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_fresh_probe_starts_where_the_last_one_on_the_model_left(family):
    """``with instrument(model)`` around each batch: what the first probe's first call learned
    (no in-place write, each block's input is the block output before it) is kept for the next
    probe on the same model and points, whose first call then takes the steady path (deferred,
    the merged hooks only) and records the model's own hidden states. A probe of other points
    learns for itself: its first call copies."""
    model = make_model(family, dtype=torch.float32)
    ids = torch.randint(1, 100, (2, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
        with _probe(model) as first:
            model(ids)
            steady_handles = first.n_handles
        with _probe(model) as fresh:
            assert fresh.n_handles == steady_handles  # merged from the start
            model(ids)
            assert len(fresh.recording._pending) == 1
        with _probe(model, capture=["resid_pre"]) as other:
            model(ids)
            assert not other.recording._pending
    rec = fresh.recording
    assert rec.n_calls == 1
    for layer in rec.layers:
        assert torch.equal(rec.resid_pre[layer], hidden[layer])
        if layer + 1 < len(rec.layers):
            assert torch.equal(rec.resid_post[layer], hidden[layer + 1])
    assert torch.equal(other.recording.resid_pre[1], hidden[1])


def test_what_probes_learn_about_a_model_keeps_nothing_alive():
    from spectral_hooks.hooks import forward_call

    model = make_model("gpt2", dtype=torch.float32)
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(1, 100, (1, 4)))
    assert model in forward_call._FACTS
    gone = weakref.ref(model)
    del model, probe
    gc.collect()
    assert gone() is None
