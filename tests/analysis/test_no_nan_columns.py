"""No column of a default table is NaN on every row (issue 36, item 7): a column that only
means something when it is asked for (``gamma_u`` with ``power.direction``, the sublayer gains
with ``jacobian.sublayers``) exists only then. Checked on the default ``power`` and ``jacobian``
tables of GPT-2, BERT (with padding), Llama (grouped-query), ALBERT (one shared layer) and the
real MiniLM-L6."""

import pytest
import torch
from transformers import (
    AlbertConfig,
    AlbertModel,
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2Model,
    LlamaConfig,
    LlamaModel,
)

import spectral_hooks as sh


def _ids(batch=2, n=7, vocab=64):
    return torch.randint(0, vocab, (batch, n), generator=torch.Generator().manual_seed(0))


def _gpt2():
    model = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                 bos_token_id=0, eos_token_id=0))
    return model, {"input_ids": _ids()}


def _bert():
    model = BertModel(BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                 intermediate_size=64, vocab_size=64, max_position_embeddings=32))
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    return model, {"input_ids": _ids(), "attention_mask": mask}


def _llama():
    model = LlamaModel(LlamaConfig(num_hidden_layers=2, hidden_size=48, intermediate_size=64,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                   bos_token_id=0, eos_token_id=0))
    return model, {"input_ids": _ids()}


def _albert():
    model = AlbertModel(AlbertConfig(num_hidden_layers=3, hidden_size=32, embedding_size=16,
                                     num_attention_heads=4, intermediate_size=64, vocab_size=64,
                                     max_position_embeddings=32))
    return model, {"input_ids": _ids()}


FAMILIES = {"gpt2": _gpt2, "bert": _bert, "llama": _llama, "albert": _albert}


def _all_nan_columns(model, batch) -> dict[str, list[str]]:
    model.eval()
    with sh.instrument(model) as probe, torch.no_grad():
        model(**batch)
        report = probe.analyze(power=True, jacobian=True, progress=False)
        tables = {name: report[name] for name in ("power", "jacobian")}
    assert all(len(t) for t in tables.values())
    return {name: [c for c in t.columns if t[c].isna().all()] for name, t in tables.items()}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_default_power_and_jacobian_tables_have_no_all_nan_column(family):
    torch.manual_seed(0)
    assert _all_nan_columns(*FAMILIES[family]()) == {"power": [], "jacobian": []}


def test_minilm_default_tables_have_no_all_nan_column(minilm):
    model, tokenizer = minilm
    batch = tokenizer(["The cat sat on the mat.", "Eigenvalues of attention layers."],
                      padding=True, return_tensors="pt")
    assert _all_nan_columns(model, dict(batch)) == {"power": [], "jacobian": []}


def test_gamma_u_exists_only_with_a_direction():
    torch.manual_seed(0)
    model, batch = _gpt2()
    with sh.instrument(model) as probe, torch.no_grad():
        model(**batch)
        default = probe.analyze(power=True, progress=False).power
        u = torch.ones(32)
        steered = probe.analyze(power={"direction": u.tolist()}, progress=False).power
    assert "gamma_u" not in default.columns
    assert steered["gamma_u"].notna().all()
    assert list(steered.drop(columns="gamma_u").columns) == list(default.columns)
