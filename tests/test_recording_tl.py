"""The recording read the TransformerLens way, checked against a real ``ActivationCache`` from
a TransformerLens 4 bridge on the same tokens: keys (names and order), ``in``, ``len``,
``items``/``values``, ``[name]``, ``[point, layer]`` with negative layers, KeyError for a
missing key, ``.to(device)`` in place; and TL hook names wherever a layer or capture is named."""

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import OptionError
from spectral_hooks.recording.points import capture_points, layer_list, parse
from tests.tiny_models import make_model

POINTS = ("hook_resid_pre", "hook_attn_out", "hook_resid_post")
TOKENS = torch.tensor([[1, 5, 7, 9, 3], [2, 4, 6, 8, 10]])


@pytest.fixture(scope="module")
def both():
    """(our recording, TL's ActivationCache restricted to the same hook names)."""
    pytest.importorskip("transformer_lens")
    from transformer_lens.ActivationCache import ActivationCache

    from tests.tiny_models import make_bridge

    bridge = make_bridge("gpt2")
    names = lambda n: n.startswith("blocks.") and n.endswith(POINTS)  # noqa: E731
    with torch.no_grad():
        _, cache = bridge.run_with_cache(TOKENS, names_filter=names)
    # TL 4 adds alias names (blocks.0.attn.hook_out); keep the canonical ones, in TL's order
    cache = ActivationCache({k: v for k, v in cache.items() if names(k)}, bridge)
    with sh.instrument(bridge) as probe, torch.no_grad():
        bridge(TOKENS)
    return probe.recording, cache


def test_keys_values_items_len_iter_match_the_cache(both):
    rec, cache = both
    assert rec.keys() == list(cache.keys())  # same names, same (run) order
    assert len(rec) == len(cache) == 6
    assert list(rec) == list(cache)
    for (name, ours), (tl_name, theirs) in zip(rec.items(), cache.items()):
        assert name == tl_name
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    assert all(torch.equal(a, b) for a, b in zip(rec.values(), [rec[k] for k in rec.keys()]))


@pytest.mark.parametrize("key", ["blocks.1.hook_resid_post", "blocks.0.hook_attn_out",
                                 ("resid_post", -1), ("resid_pre", 0), ("attn_out", -2),
                                 ("resid_post", 1, None)])
def test_indexing_like_the_cache(both, key):
    rec, cache = both
    torch.testing.assert_close(rec[key], cache[key], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["blocks.1.hook_resid_post", "blocks.0.hook_resid_pre",
                                  "blocks.2.hook_resid_post", "blocks.1.hook_mlp_out",
                                  "resid_post1", ("resid_post", 1), 3, "mask"])
def test_in_like_the_cache(both, name):
    rec, cache = both
    assert (name in rec) == (name in cache)


@pytest.mark.parametrize("key", ["blocks.5.hook_resid_post", ("resid_post", 5)])
def test_missing_key_is_a_key_error_in_both(both, key):
    rec, cache = both
    with pytest.raises(KeyError):
        cache[key]
    with pytest.raises(KeyError):
        rec[key]


def test_to_moves_in_place_and_returns_the_recording():
    model = make_model("gpt2", dtype=torch.float32)
    with sh.instrument(model) as probe, torch.no_grad():
        model(TOKENS)
    rec = probe.recording
    before = {k: v.clone() for k, v in rec.items()}
    generation = rec.generation
    assert rec.to(torch.device("cpu")) is rec and rec.generation > generation
    assert all(torch.equal(before[k], v) for k, v in rec.items())
    assert len(probe.analyze(power=True).power) == 2
    assert rec.to("meta") is rec  # a device without data: shows that everything moved
    assert {v.device.type for v in rec.values()} == {"meta"}
    assert rec.block_input(0).hidden.device.type == "meta"
    assert rec.model_inputs[0][0][0].device.type == "meta"
    assert rec.mask.device.type == "cpu"  # masks stay on the CPU


def test_no_keys_before_any_forward_or_with_stats():
    model = make_model("gpt2", dtype=torch.float32)
    with sh.instrument(model) as probe:
        assert len(probe.recording) == 0 and probe.recording.keys() == []
    with sh.instrument(model, store="stats") as probe, torch.no_grad():
        model(TOKENS)
        assert len(probe.recording) == 0 and len(probe.recording.steps) == 1
        assert probe.recording.stats("hook_resid_post", "blocks.1").count == 10


def test_tl_names_in_instrument_and_readers():
    model = make_model("gpt2", dtype=torch.float32)
    with sh.instrument(model, layers=["blocks.1"], capture="hook_resid_post") as probe, \
            torch.no_grad():
        model(TOKENS)
    assert probe.layers == (1,) and probe.recording.capture == ("resid_post",)
    assert probe.recording.keys() == ["blocks.1.hook_resid_post"]
    assert torch.equal(probe.recording.tokens("hook_resid_post", "blocks.1"),
                       probe.recording.tokens("resid_post", 1))
    with sh.instrument(model, layers="blocks.-1.hook_resid_post",
                       capture=["blocks.0.hook_resid_pre", "resid_post"]) as probe:
        assert probe.layers == (1,) and probe.recording.capture == ("resid_pre", "resid_post")
    for bad in (dict(layers=["blocks.x"]), dict(layers=["hook_resid_post"]),
                dict(capture=["hook_mlp_out"]), dict(layers=["blocks.7"])):
        with pytest.raises((OptionError, IndexError)):
            sh.instrument(model, **bad)


def test_parse_forms():
    assert parse("blocks.12.hook_attn_out") == ("attn_out", 12)
    with pytest.raises(ValueError):
        parse("attn_out3")  # no short forms: TransformerLens' get_act_name has none for these
    assert capture_points(("resid_post", "hook_resid_post")) == ("resid_post",)
    assert layer_list("blocks.2") == [2] and layer_list(3) == [3] and layer_list(None) is None
    with pytest.raises(ValueError):
        parse("blocks.1.attn.hook_z")


def test_a_batch_of_strings_without_a_mask_is_refused():
    """TransformerLens pads a list of strings inside the model, out of the probe's sight: the
    probe refuses it (naming the fix) before any block runs, and records nothing."""
    pytest.importorskip("transformer_lens")
    from spectral_hooks.errors import RecordingError
    from tests.tiny_models import make_bridge

    bridge = make_bridge("gpt2")
    with sh.instrument(bridge) as probe, torch.no_grad():
        with pytest.raises(RecordingError, match="to_tokens"):
            bridge(["a longer sentence", "short"])
        assert probe.recording.n_calls == 0
        bridge(TOKENS)  # the probe still records the next call
        assert probe.recording.n_calls == 1
