"""The Jacobian rows name their token: the id the model was called with at (sample, position)
and its text (issue 12, point 7)."""

import pytest
import torch
from transformers import AutoTokenizer

import spectral_hooks as sh
from spectral_hooks.errors import OptionError
from tests.tiny_models import make_bridge, make_model, tokenizer_path

JAC = {"k": 2, "positions": "all", "dense": True}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tokenizer_path())


def test_rows_carry_the_token_id_and_text_of_their_position(tokenizer):
    model = make_model("gpt2")
    ids = torch.tensor([[11, 12, 13, 14], [0, 0, 21, 22]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with sh.instrument(model) as probe, torch.no_grad():
        model(ids, attention_mask=mask)
    for sample in (0, 1):
        table = probe.analyze(power=False, jacobian={**JAC, "sample": sample},
                              tokenizer=tokenizer).jacobian
        assert len(table) == 2 * int(mask[sample].sum())
        for row in table.itertuples():
            assert row.sample == sample and mask[sample, row.position] == 1
            assert row.token_id == int(ids[sample, row.position])
            assert row.token == tokenizer.decode([row.token_id])


def test_decode_steps_are_named_by_the_token_fed_at_that_step():
    model = make_model("gpt2", wrapper=True)
    prompt = torch.tensor([[5, 6, 7]])
    with sh.instrument(model) as probe, torch.no_grad():
        out = model.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
    # the last generated token is never fed back, so the recording ends one before it
    assert probe.recording.token_ids.tolist() == [out[0, :-1].tolist()]


def test_embeddings_input_has_no_token_and_no_tokenizer_means_no_text(tokenizer):
    model = make_model("gpt2")
    with sh.instrument(model) as probe, torch.no_grad():
        model(inputs_embeds=torch.randn(1, 3, 32, dtype=torch.float64))
    table = probe.analyze(power=False, jacobian=JAC, tokenizer=tokenizer).jacobian
    assert set(table.token_id) == {-1} and set(table.token) == {""}
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.tensor([[3, 4]]))
    table = probe.analyze(power=False, jacobian=JAC).jacobian
    assert table.token_id.tolist() == [3, 4, 3, 4] and set(table.token) == {""}


def test_transformerlens_model_names_tokens_with_its_own_tokenizer():
    bridge = make_bridge("gpt2")
    ids = torch.tensor([[101, 7592, 2088]]) % 100
    with sh.instrument(bridge) as probe, torch.no_grad():
        bridge(ids)
    table = probe.analyze(power=False, jacobian={"k": 2, "dense": True}).jacobian
    assert table.token.tolist() == [bridge.tokenizer.decode([int(ids[0, -1])])] * 2


def test_a_tokenizer_without_decode_is_refused():
    with pytest.raises(OptionError, match="tokenizer"):
        sh.AnalyzeOptions(tokenizer=object())
