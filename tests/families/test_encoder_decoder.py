"""Encoder-decoder models (issue 15): T5, Flan-T5, BART, Whisper, each stack checked like a family.

Tiny float64 configs built offline here (not in tests.tiny_models.FAMILIES: these models take
two inputs). Per family and per stack: the recording equals the model's own
``encoder_hidden_states`` / ``decoder_hidden_states``; self-attention F and (decoder)
cross-attention F equal a least-squares fit of the raw modules; the dense block Jacobian equals
``jacfwd`` of the real block (decoder blocks with the encoder output held fixed as recorded)
and the matrix-free top-k agrees with it; outputs are bit-identical with the probe, and no
handle is left, also when the body raises.
"""

import warnings

import pytest
import torch
from transformers import (
    BartConfig,
    BartModel,
    T5Config,
    T5EncoderModel,
    T5ForConditionalGeneration,
    T5Model,
    WhisperConfig,
    WhisperModel,
)

import spectral_hooks as sh
from spectral_hooks.anatomy.base import fresh_model
from spectral_hooks.anatomy.calls import HF_CALLS
from spectral_hooks.encoder_decoder import EncoderDecoderProbe
from spectral_hooks.errors import (
    FallbackWarning,
    MissingWeightsError,
    RecordingError,
    UnsupportedModelError,
    collecting_fallbacks,
)
from spectral_hooks.hooks.taps import count_hook_points as count_hooks
from spectral_hooks.linearize import block_function, block_jacobian
from spectral_hooks.linearize.function import linearize
from tests.families.harness import check_F, check_jacobian, check_recording
from tests.oracles import token_jacobian

D, N_MEL, SOURCE_POSITIONS = 32, 8, 6
_SIZES = dict(d_model=D, vocab_size=100, encoder_layers=2, decoder_layers=2,
              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
              decoder_ffn_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
              decoder_start_token_id=1, dropout=0.0, attention_dropout=0.0,
              activation_dropout=0.0)
_T5 = dict(d_model=D, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
           vocab_size=100, relative_attention_num_buckets=8, dropout_rate=0.0)
CONFIGS = {
    "t5": lambda: T5Model(T5Config(**_T5)),
    # Flan-T5: the same stacks with a gated-GELU feed-forward and untied embeddings
    "flan_t5": lambda: T5Model(T5Config(feed_forward_proj="gated-gelu",
                                        tie_word_embeddings=False, **_T5)),
    "bart": lambda: BartModel(BartConfig(max_position_embeddings=64, **_SIZES)),
    "whisper": lambda: WhisperModel(WhisperConfig(
        num_mel_bins=N_MEL, max_source_positions=SOURCE_POSITIONS, max_target_positions=32,
        **_SIZES)),
}
# The raw modules (oracle knowledge, written out independently of spectral_hooks.anatomy):
# the input of the first feeds the value projection, the second is the output projection.
SELF = dict.fromkeys(("t5", "flan_t5"), ("layer.0.SelfAttention.v", "layer.0.SelfAttention.o"))
CROSS = dict.fromkeys(("t5", "flan_t5"), ("layer.1.EncDecAttention.v",
                                         "layer.1.EncDecAttention.o"))
SELF_BART = ("self_attn.v_proj", "self_attn.out_proj")
CROSS_BART = ("encoder_attn.v_proj", "encoder_attn.out_proj")
FAMILIES = tuple(CONFIGS)


def make(family: str, seed: int = 0):
    torch.manual_seed(seed)
    return CONFIGS[family]().to(torch.float64).eval()


def inputs(family: str) -> dict:
    g = torch.Generator().manual_seed(1)
    decoder_ids = torch.randint(3, 100, (2, 5), generator=g)
    if family == "whisper":
        features = torch.randn(2, N_MEL, 2 * SOURCE_POSITIONS, generator=g, dtype=torch.float64)
        return {"input_features": features, "decoder_input_ids": decoder_ids}
    return {"input_ids": torch.randint(3, 100, (2, 6), generator=g),
            "decoder_input_ids": decoder_ids}


@pytest.fixture(scope="module", params=FAMILIES)
def recorded(request):
    """(family, model, composite probe) after checking the recording of both stacks."""
    family = request.param
    model = make(family)
    probe = check_recording(model, inputs(family), stacks=("encoder", "decoder"))
    return family, model, probe


def _one_token_blocks(blocks, *, decoder: bool):
    """The oracle's model call: every block on a batch of 4d single tokens (one key, so each
    attention weight is 1), decoder blocks on a one-token encoder output."""
    def call(_model):
        for block in blocks:
            h = torch.randn(4 * D, 1, D, dtype=torch.float64)
            extra = {"encoder_hidden_states": torch.randn_like(h)} if decoder else {}
            block(h, attention_mask=None, **extra)
    return call


def test_anatomy_one_per_stack(recorded):
    family, model, probe = recorded
    anatomy = sh.anatomy_of(model)
    assert isinstance(anatomy, sh.EncoderDecoderAnatomy)
    assert anatomy.family == family.replace("flan_", "")
    assert isinstance(probe, EncoderDecoderProbe)
    for stack, causal in (("encoder", False), ("decoder", True)):
        part = anatomy[stack]
        assert (part.stack, part.causal, part.n_layers) == (stack, causal, 2)
        assert part.call_root is getattr(model, stack)
    assert anatomy.decoder.layers[0].cross_value is not None
    with pytest.raises(MissingWeightsError, match="no cross-attention"):
        anatomy.encoder.layers[0].cross_value_weights()
    for one_stack_only in (sh.layer_matrices, sh.Probe,
                           lambda m: sh.steer(m, torch.ones(D, dtype=torch.float64))):
        with pytest.raises(UnsupportedModelError, match="encoder-decoder"):
            one_stack_only(model)


def test_recording_names(recorded):
    _, model, probe = recorded
    rec = probe.recording
    assert rec["encoder"] is probe.encoder.recording and rec.decoder is probe.decoder.recording
    torch.testing.assert_close(rec["decoder.blocks.1.hook_resid_post"],
                               probe.decoder.recording.resid_post[1], rtol=0, atol=0)
    with pytest.raises(KeyError, match="encoder"):
        rec["middle"]
    assert rec.decoder.resid_pre[0].shape == (2, 5, D)


@pytest.mark.parametrize("stack", ("encoder", "decoder"))
def test_self_attention_F(recorded, stack):
    family, model, probe = recorded
    value_in, output = SELF.get(family, SELF_BART)
    anatomy = probe.probes[stack].anatomy
    blocks = [part.block for part in anatomy.layers]
    check_F(model, value_in, output, anatomy=anatomy,
            call=_one_token_blocks(blocks, decoder=stack == "decoder"))


def test_cross_attention_F(recorded):
    family, model, probe = recorded
    value_in, output = CROSS.get(family, CROSS_BART)
    anatomy = probe.decoder.anatomy
    blocks = [part.block for part in anatomy.layers]
    check_F(model, value_in, output, anatomy=anatomy, cross=True,
            call=_one_token_blocks(blocks, decoder=True))
    F = sh.layer_matrices(anatomy, attention="cross")
    assert F.shape == (2, D, D) and not torch.allclose(F, sh.layer_matrices(anatomy))


# Every T5 layer (layer 0 computes the relative position bias, later ones receive it); the
# last layer of BART, Whisper and Flan-T5 (gated-GELU feed-forward; layers alike, and a trace
# costs seconds).
JACOBIAN_LAYERS = {"t5": (0, 1), "flan_t5": (1,), "bart": (1,), "whisper": (1,)}


@pytest.mark.parametrize("stack", ("encoder", "decoder"))
def test_block_jacobians(recorded, stack):
    family, _, probe = recorded
    check_jacobian(probe.probes[stack], k=4, layers=JACOBIAN_LAYERS[family])


def test_decoder_call_holds_the_encoder_output(recorded):
    """The recorded decoder block call carries the encoder output (the stack's final output)
    and a replay of it runs the full decoder sequence, quietly: no fallback is taken."""
    family, model, probe = recorded
    with torch.no_grad():
        encoder_out = model(**inputs(family)).encoder_last_hidden_state
    call = probe.decoder.recording.block_input(1, sample=1)
    held = [t for t in (*call.args, *call.kwargs.values()) if isinstance(t, torch.Tensor)
            and t.shape == (1, *encoder_out.shape[1:]) and torch.equal(t, encoder_out[1:2])]
    assert held, "the encoder output is not part of the recorded decoder call"
    taken: list = []
    with collecting_fallbacks(taken):
        op = probe.decoder.jacobian(1, sample=1, method="jvp")
        op.matvec(torch.ones(D, dtype=torch.float64))
    assert op.single_query_mode is None and op.shape == (D, D) and taken == []


def test_t5_position_bias_refused_by_split_attention():
    """Forcing the single-query replay on a T5 decoder block: the split core refuses the
    relative position bias, so the replay falls back to the full block, and the Jacobian is
    still jacfwd's."""
    model = make("t5")
    with torch.no_grad(), sh.instrument(model) as probe:
        model(**inputs("t5"))
    anatomy = probe.decoder.anatomy.replace(call_convention=HF_CALLS)
    taken: list = []
    with collecting_fallbacks(taken), warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)  # warned once per process
        op = block_jacobian(anatomy, probe.decoder.recording, 1, position=-1, method="jvp")
    assert op.single_query_mode is None
    assert "linearize.full_sequence" in taken
    want = token_jacobian(probe.decoder, 1)
    got = op.to_dense()
    assert float((got - want).abs().max()) <= 1e-10 * float(want.abs().max())


def test_split_attention_refuses_position_bias():
    from spectral_hooks.linearize.single_query import _PENDING, _split_attention

    q = torch.randn(1, 4, 1, 8, dtype=torch.float64)
    _PENDING.set((torch.randn(1, 4, 3, 8, dtype=torch.float64),
                  torch.randn(1, 4, 3, 8, dtype=torch.float64), ("position_bias",)))
    with pytest.raises(NotImplementedError, match="position_bias"):
        _split_attention(None, q, q, q, None, position_bias=torch.zeros(1, 4, 1, 4))


def test_no_handle_left_when_the_body_raises(recorded):
    family, model, _ = recorded

    def hooks():
        return count_hooks(model)

    before = hooks()
    with pytest.raises(RuntimeError, match="boom"):
        with sh.instrument(model) as probe:
            assert probe.n_handles > 0 and hooks() == before + probe.n_handles
            model(**inputs(family))
            raise RuntimeError("boom")
    assert probe.n_handles == 0 and hooks() == before
    assert len(probe.encoder.recording.steps) == 1 and len(probe.decoder.recording.steps) == 1


def test_analyze_gives_a_report_per_stack(recorded):
    """One report per stack; the decoder's has a cross_power section: power's columns for the
    cross-attention F (weights alone, token columns NaN)."""
    _, _, probe = recorded
    reports = probe.analyze(power=True)
    assert set(reports) == {"encoder", "decoder"}
    for stack, report in reports.items():
        assert list(report.power["layer"]) == [0, 1] and report.metadata["stack"] == stack
    assert "cross_power" not in reports["encoder"].sections
    cross = reports["decoder"]["cross_power"]
    F = sh.layer_matrices(probe.decoder.anatomy, attention="cross")
    want = [float(torch.linalg.eigvals(f).abs().max()) for f in F]
    assert list(cross["layer"]) == [0, 1]
    torch.testing.assert_close(torch.tensor(cross["abs_lambda1"].to_numpy()),
                               torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=0)
    assert cross["gamma"].isna().all()


def test_generate_appends_decoder_steps():
    torch.manual_seed(0)
    config = T5Config(d_model=D, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=100,
                      relative_attention_num_buckets=8, dropout_rate=0.0,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config).to(torch.float64).eval()
    with sh.instrument(model) as probe:
        model.generate(input_ids=torch.randint(3, 100, (2, 6)), max_new_tokens=3,
                       min_new_tokens=3, do_sample=False)
    assert len(probe.encoder.recording.steps) == 1  # the encoder runs once
    assert [s.step for s in probe.decoder.recording.steps] == [0, 1, 2]
    assert probe.decoder.recording.resid_post[1].shape == (2, 3, D)
    assert probe.n_handles == 0


def test_encoder_only_model_is_one_stack():
    torch.manual_seed(0)
    model = T5EncoderModel(T5Config(d_model=D, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                    vocab_size=100, dropout_rate=0.0)).to(torch.float64).eval()
    anatomy = sh.anatomy_of(model)
    assert isinstance(anatomy, sh.Anatomy) and anatomy.stack == "encoder"
    ids = torch.randint(3, 100, (2, 6))
    with torch.no_grad(), sh.instrument(model) as probe:
        out = model(input_ids=ids, output_hidden_states=True)
    assert isinstance(probe, sh.Probe)
    torch.testing.assert_close(probe.recording.resid_post[0], out.hidden_states[1], rtol=0,
                               atol=0)


def test_record_on_runs_each_stack_alone(recorded):
    """The re-initialised control: a stack's inputs replayed through the same stack of a fresh
    model (the decoder on the recorded encoder output)."""
    family, model, probe = recorded
    fresh = fresh_model(model, seed=3)
    for stack in ("encoder", "decoder"):
        anatomy, rec = probe.probes[stack].record_on(fresh)
        assert anatomy.stack == stack and anatomy.model is fresh
        mine = probe.probes[stack].recording.resid_post[1]
        assert rec.resid_post[1].shape == mine.shape and not torch.allclose(rec.resid_post[1], mine)


def test_whisper_empty_batch_is_refused():
    model = make("whisper")
    with pytest.raises(RecordingError, match="empty batch"), sh.instrument(model) as probe:
        model(input_features=torch.zeros(0, N_MEL, 2 * SOURCE_POSITIONS, dtype=torch.float64),
              decoder_input_ids=torch.zeros(0, 2, dtype=torch.long))
    assert probe.n_handles == 0


def test_layers_per_stack_and_no_hook_left_by_a_bad_one():
    model = make("bart")

    def hooks():
        return count_hooks(model)

    before = hooks()
    with torch.no_grad(), sh.instrument(model, layers={"encoder": [-1], "decoder": [0]}) as probe:
        model(**inputs("bart"))
    assert probe.encoder.recording.layers == (1,) and probe.decoder.recording.layers == (0,)
    with pytest.raises(IndexError):  # the decoder's layer is out of range: the encoder's
        sh.instrument(model, layers={"encoder": [0], "decoder": [5]})  # hooks go too
    with pytest.raises(ValueError, match="middle"):
        sh.instrument(model, layers={"middle": [0]})
    assert hooks() == before


def test_t5_relative_buckets_make_a_traced_linearisation_drift():
    """T5's bidirectional bucket computation updates a tensor in place that torch.func.linearize
    folds as a constant: a second call of the plain traced JVP differs. ``linearize`` sees it
    and traces again through torch.func.functionalize, whose graph is reproducible and equals
    torch.func.jvp of the block (checked = jacfwd above)."""
    from spectral_hooks.linearize.function import _irreproducible, _traced_jvp, plain_jvp

    model = make("t5")
    with torch.no_grad(), sh.instrument(model, layers={"encoder": [0], "decoder": [1]}) as probe:
        model(**inputs("t5"))
    fn = block_function(probe.encoder.anatomy, probe.encoder.recording, 0)
    assert _irreproducible(_traced_jvp(fn, fn.x0), fn.x0) is not None
    jvp = linearize(fn, fn.x0)
    v = torch.randn(fn.x0.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    first, second, want = jvp(v), jvp(v), plain_jvp(fn, fn.x0)(v)
    assert torch.equal(first, second)
    torch.testing.assert_close(first, want, rtol=1e-12, atol=1e-12)
