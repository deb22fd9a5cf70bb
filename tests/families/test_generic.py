"""The generic fallback never guesses silently: it warns, decides causality by behaviour,
checks itself on the first recorded batch, and refuses (naming register_anatomy) otherwise."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import spectral_hooks as sh
from spectral_hooks.errors import GenericAnatomyWarning, RecordingError, UnsupportedModelError
from tests.families.configs_encoders import inputs_for, make
from tests.tiny_models import make_model

D = 8


class Attention(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(D, D), nn.Linear(D, D)
        self.v_proj, self.o_proj = nn.Linear(D, D), nn.Linear(D, D)
        self.causal = causal

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, 2, D // 2).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, D))


class Block(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.attn, self.calls = Attention(causal), 0

    def forward(self, x, drift: bool = False):
        self.calls += 1
        return x + self.attn(x) + (self.calls * 1e-3 if drift else 0.0)


class Stack(nn.Module):
    """A custom model no family knows: ``between`` applies tanh between blocks (not one
    residual stream); ``drift`` makes every block call differ (a replay cannot reproduce it)."""

    def __init__(self, *, causal=False, between=False, drift=False) -> None:
        super().__init__()
        self.config = SimpleNamespace(hidden_size=D, num_attention_heads=2)
        self.blocks = nn.ModuleList([Block(causal) for _ in range(2)])
        self.between, self.drift = between, drift

    def forward(self, inputs_embeds):
        x = inputs_embeds
        for block in self.blocks:
            x = block(x, drift=self.drift)
            x = torch.tanh(x) if self.between else x
        return x


def _generic(model):
    with pytest.warns(GenericAnatomyWarning, match="generic anatomy"):
        anatomy = sh.anatomy_of(model)
    assert anatomy.family.startswith("generic/") and anatomy.verify is not None
    return anatomy


def _run(model, **inputs):
    with pytest.warns(GenericAnatomyWarning), sh.instrument(model) as probe, torch.no_grad():
        model(**inputs)
    return probe


@pytest.mark.parametrize("causal", [False, True])
def test_custom_stack_causality_is_decided_by_behaviour(causal):
    torch.manual_seed(0)
    model = Stack(causal=causal).double()
    _generic(model)
    probe = _run(model, inputs_embeds=torch.randn(1, 5, D, dtype=torch.float64))
    assert probe.anatomy.verify is None and probe.anatomy.causal is causal


@pytest.mark.parametrize("kind, why", [("between", "one residual stream"),
                                       ("drift", "does not reproduce")])
def test_custom_stack_failing_the_self_check_is_refused(kind, why):
    torch.manual_seed(0)
    model = Stack(**{kind: True}).double()
    with pytest.warns(GenericAnatomyWarning), sh.instrument(model) as probe:
        with pytest.raises(UnsupportedModelError, match=f"{why}.*spectral_hooks.register_anatomy"):
            model(inputs_embeds=torch.randn(1, 5, D, dtype=torch.float64))
    assert probe.n_handles == 0 and len(probe.recording) == 0


class StreamBlock(nn.Module):
    """A block over two parallel residual streams [batch, pos, 2, D] (hyper-connections)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention(causal=True)

    def forward(self, x):
        return x + self.attn(x.mean(2))[:, :, None]


class StreamStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(hidden_size=D, num_attention_heads=2)
        self.blocks = nn.ModuleList([StreamBlock() for _ in range(2)])

    def forward(self, inputs_embeds):
        x = inputs_embeds[:, :, None].expand(-1, -1, 2, -1).contiguous()
        for block in self.blocks:
            x = block(x)
        return x.mean(2)


def test_parallel_residual_streams_are_refused_in_one_worded_error():
    """Blocks whose input is [batch, pos, streams, d] (DeepSeek-V4 / HY-V4 hyper-connections
    under no family) are refused on the first batch, the shape named, not left to fail deep in
    an analysis."""
    torch.manual_seed(0)
    model = StreamStack().double()
    with pytest.warns(GenericAnatomyWarning), sh.instrument(model) as probe:
        with pytest.raises(UnsupportedModelError) as caught:
            model(inputs_embeds=torch.randn(1, 5, D, dtype=torch.float64))
    message = str(caught.value)
    assert "block 0's input has shape [1, 5, 2, 8], not [batch, pos, 8]" in message
    assert message.count("cannot be described") == 1 and "register_anatomy" in message
    assert probe.n_handles == 0 and len(probe.recording) == 0


@pytest.mark.parametrize("head_dim", [4, None])
def test_heads_are_fitted_to_the_projections_or_refused(head_dim):
    """A config whose head count does not divide the projections (a stack whose layer types
    differ in heads): the attention module's own head_dim is used where it fits, the shapes
    are named where nothing fits, at instrument() rather than inside an analysis."""
    torch.manual_seed(0)
    model = Stack(causal=True).double()
    model.config.num_attention_heads = 3  # 8 / 3: no whole head size
    for block in model.blocks:
        block.attn.head_dim = head_dim
    if head_dim is None:
        with pytest.raises(
                UnsupportedModelError, match=r"layer 0's attention projections \(values 8, "
                                             r"output 8 wide\) fit neither the config's 3 heads"):
            sh.anatomy_of(model)
        return
    anatomy = _generic(model)
    assert tuple(anatomy.layers[0].value_weights().shape) == (2, 4, 8)
    probe = _run(model, inputs_embeds=torch.randn(1, 5, D, dtype=torch.float64))
    assert len(probe.analyze(power=True, progress=False).power) == 2


class TwoStacks(nn.Module):
    """A longer stack that does not run on text (a vision tower) beside the one that does."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(hidden_size=D, num_attention_heads=2)
        self.vision = nn.ModuleList([Block(causal=False) for _ in range(3)])
        self.text = nn.ModuleList([Block(causal=True) for _ in range(2)])

    def forward(self, inputs_embeds):
        x = inputs_embeds
        for block in self.text:
            x = block(x)
        return x


def test_a_call_that_runs_none_of_the_recorded_blocks_says_so_once(caplog):
    torch.manual_seed(0)
    model = TwoStacks().double()
    with pytest.warns(GenericAnatomyWarning), sh.instrument(model) as probe, torch.no_grad():
        assert probe.anatomy.layers[0].block is model.vision[0]  # the longest list
        for _ in range(2):
            model(inputs_embeds=torch.randn(1, 4, D, dtype=torch.float64))
    said = [r.getMessage() for r in caplog.records if "none of the recorded blocks" in r.getMessage()]
    assert len(said) == 1 and "(Block, layers 0-2)" in said[0] and "instrument the one" in said[0]
    with pytest.raises(RecordingError, match="nothing recorded"):
        probe.recording.resid_pre[0]


def test_vit_through_the_generic_fallback_is_bidirectional():
    model = make("vit")
    model.config.model_type = "unknown_vit"
    assert not _generic(model).causal  # provisional until checked
    with pytest.warns(GenericAnatomyWarning), sh.instrument(model) as probe, torch.no_grad():
        out = model(**inputs_for("vit"), output_hidden_states=True)
    assert probe.anatomy.verify is None and probe.anatomy.causal is False
    for layer in range(probe.anatomy.n_layers):
        torch.testing.assert_close(probe.recording.resid_pre[layer], out.hidden_states[layer],
                                   rtol=0, atol=1e-12)


def test_llama_through_the_generic_fallback_is_causal_with_the_family_F():
    model = make_model("llama")
    family = sh.anatomy_of(model)
    model.config.model_type = "mystery"
    generic = _generic(model)
    for a, b in zip(family.layers, generic.layers):
        torch.testing.assert_close(a.value_weights(), b.value_weights(), rtol=0, atol=0)
        torch.testing.assert_close(a.output_weights(), b.output_weights(), rtol=0, atol=0)
    probe = _run(model, input_ids=torch.randint(0, 100, (2, 5)), output_hidden_states=True)
    assert probe.anatomy.causal is True


def test_analysis_waits_for_the_check():
    model = Stack().double()
    with pytest.warns(GenericAnatomyWarning), sh.instrument(model) as probe:
        with torch.no_grad():  # one token: causality cannot be decided yet
            model(inputs_embeds=torch.randn(1, 1, D, dtype=torch.float64))
        assert probe.anatomy.verify is not None
        with pytest.raises(RecordingError, match="at least two real tokens"):
            probe.analyze(power=True)
        with torch.no_grad():
            model(inputs_embeds=torch.randn(1, 3, D, dtype=torch.float64))
        assert probe.anatomy.verify is None and not probe.anatomy.causal
        assert len(probe.analyze(power=True).power) == 2


def test_a_recurrent_model_is_refused_with_what_was_found():
    """RWKV's time mixing is none of the mixers the anatomy knows (attention with query and
    value projections, latent or linear attention, a state-space mixer, a short convolution):
    the refusal names the module it found and register_anatomy. Mamba, which the fallback
    refused before, is a family of its own now (tests/families/test_hybrid.py)."""
    import transformers as tf

    rwkv = tf.RwkvModel(tf.RwkvConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                      attention_hidden_size=32, intermediate_size=64))
    with pytest.raises(UnsupportedModelError, match=r"RwkvSelfAttention\) has no query and "
                                                    r"value projections.*register_anatomy"):
        sh.anatomy_of(rwkv)
    mamba = tf.MambaModel(tf.MambaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                         state_size=4, expand=2, conv_kernel=2))
    anatomy = sh.anatomy_of(mamba)
    assert anatomy.family == "mamba" and [p.mixer for p in anatomy.layers] == ["state_space"] * 2


def test_a_mixed_stack_of_unknown_type_gets_one_kind_per_layer():
    """A Jamba-like stack of two block classes (Mamba, then attention) under an unknown model
    type: the fallback finds the list of mixed blocks and describes each layer by its own kind;
    the power view covers the attention layer only."""
    from tests.families.configs_hybrid import make as make_hybrid

    model = make_hybrid("jamba", dtype=torch.float32)
    model.config.model_type = "mystery_hybrid"
    anatomy = _generic(model)
    assert [(p.mixer, p.mlp) for p in anatomy.layers] == [("state_space", "dense"),
                                                          ("gqa", "routed")]
    assert anatomy.ov_layers == (1,)
