"""Capture point ``attn_pattern`` (``blocks.<l>.attn.hook_pattern``): equals the attention
probabilities the model returns with ``output_attentions=True``, changes no output bit, is
opt-in, refused clearly where the model cannot give it (no hook left behind), stacks generate()
decode steps, and matches TransformerLens 4's own ``hook_pattern``."""

from __future__ import annotations

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import OptionError, RecordingKeyError, UnsupportedModelError
from spectral_hooks.hooks.taps import count_hook_points as count_hooks
from spectral_hooks.recording.points import capture_points, hook_name, parse
from tests.tiny_models import _config, make_model

ALL = ("resid_pre", "resid_post", "attn_out", "attn_pattern")


def eager(family: str, *, wrapper: bool = False) -> torch.nn.Module:
    config, base_cls, wrapper_cls = _config(family)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return (wrapper_cls if wrapper else base_cls)(config).double().eval()


def test_names():
    assert hook_name("attn_pattern", 2) == "blocks.2.attn.hook_pattern"
    assert parse("blocks.2.attn.hook_pattern") == ("attn_pattern", 2)
    assert parse("hook_pattern") == ("attn_pattern", None)
    assert capture_points(["hook_resid_pre", "blocks.0.attn.hook_pattern"]) == \
        ("resid_pre", "attn_pattern")


@pytest.mark.parametrize("family", ["gpt2", "bert", "albert", "gpt_neox", "llama", "gemma2"])
def test_pattern_equals_output_attentions_and_outputs_are_bit_identical(family):
    model = eager(family)
    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    with sh.instrument(model, capture=ALL) as probe, torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
        assert probe.n_handles > 0
    assert probe.n_handles == 0
    assert torch.equal(out.last_hidden_state, reference.last_hidden_state)
    rec = probe.recording
    for t in range(len(reference.attentions)):
        assert torch.equal(rec.attn_pattern[t], reference.attentions[t])
        assert torch.equal(rec[hook_name("attn_pattern", t)], reference.attentions[t])
    assert hook_name("attn_pattern", 0) in rec.keys()
    with pytest.raises(RecordingKeyError, match="attn_pattern"):
        rec.tokens("attn_pattern", 0)


def test_not_captured_by_default():
    model = eager("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
    assert "attn_pattern" not in probe.recording.capture
    with pytest.raises(RecordingKeyError, match="attn_pattern"):
        probe.recording.attn_pattern[0]


def test_sdpa_model_is_refused_with_how_to_load_it_and_no_hook_left():
    model = make_model("gpt2")  # SDPA: no probabilities
    before = count_hooks(model)
    with pytest.raises(UnsupportedModelError, match="attn_implementation='eager'"):
        sh.instrument(model, capture=["resid_pre", "attn_pattern"])
    after = count_hooks(model)
    assert after == before


def test_stats_store_refuses_patterns():
    with pytest.raises(OptionError, match="attn_pattern"):
        sh.instrument(eager("gpt2"), capture=["attn_pattern"], store="stats")


def test_generate_decode_steps_stack_along_the_queries():
    model = eager("gpt2", wrapper=True)
    ids = torch.tensor([[1, 2, 3, 4]])
    with sh.instrument(model, capture=["resid_pre", "attn_pattern"]) as probe, torch.no_grad():
        model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    P = probe.recording.attn_pattern[1]
    n = probe.recording.mask.shape[1]
    assert P.shape == (1, 4, n, n)
    torch.testing.assert_close(P.sum(-1), torch.ones(1, 4, n, dtype=P.dtype))
    assert torch.equal(P.triu(1), torch.zeros_like(P))  # causal: no key after the query


def test_transformer_lens_bridge_pattern_equals_its_hook_pattern():
    pytest.importorskip("transformer_lens")
    from tests.tiny_models import make_bridge

    bridge = make_bridge("gpt2")
    ids = torch.tensor([[1, 5, 7, 9, 3]])
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids)
    with sh.instrument(bridge, capture=["resid_pre", "attn_pattern"]) as probe, torch.no_grad():
        bridge(ids)
    for t in range(2):
        assert torch.equal(probe.recording.attn_pattern[t], cache[hook_name("attn_pattern", t)])
