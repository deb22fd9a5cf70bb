"""Decoder families (issue 15): GPT-J, OPT, BLOOM, Falcon (grouped and multi-query), Phi, Phi3,
StableLM, Cohere, Granite, Starcoder2, GPT-BigCode, MPT, Nemotron: every check of
tests/families/harness.py on a tiny float64 model, and the power view on fused layouts."""

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.linearize import block_jacobian
from tests.families.configs_decoders import DECODERS, VARIANTS, make
from tests.families.harness import check_F, check_family, check_jacobian, oracle_F

# The modules whose input feeds the value projection and whose output is W_O(.) + b_O,
# written out from the HF modelling code (independently of spectral_hooks.anatomy).
RAW = {
    "gptj": ("attn.v_proj", "attn.out_proj"),
    "opt": ("self_attn.v_proj", "self_attn.out_proj"),
    "bloom": ("self_attention.query_key_value", "self_attention.dense"),
    "falcon": ("self_attention.query_key_value", "self_attention.dense"),
    "falcon_mq": ("self_attention.query_key_value", "self_attention.dense"),
    "falcon_alibi": ("self_attention.query_key_value", "self_attention.dense"),
    "opt_post": ("self_attn.v_proj", "self_attn.out_proj"),
    "gpt_bigcode_mha": ("attn.c_attn", "attn.c_proj"),
    "phi": ("self_attn.v_proj", "self_attn.dense"),
    "phi3": ("self_attn.qkv_proj", "self_attn.o_proj"),
    "gpt_bigcode": ("attn.c_attn", "attn.c_proj"),
    "mpt": ("attn.Wqkv", "attn.out_proj"),
}
# BLOOM's GeLU is an autograd.Function without forward AD: its oracle is reverse-mode autograd
ORACLE_MODE = {"bloom": "autograd"}


def _ids(seed: int = 1, length: int = 5) -> dict:
    return {"input_ids": torch.randint(0, 100, (1, length),
                                       generator=torch.Generator().manual_seed(seed))}


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_family(name):
    model = make(name)
    value_in, output = RAW.get(name, ("self_attn.v_proj", "self_attn.o_proj"))
    check_family(model, _ids(), value_in=value_in, output=output, causal=True,
                 family=name, k=2, oracle_mode=ORACLE_MODE.get(name, "forward"))


@pytest.mark.parametrize("name", VARIANTS)
def test_config_variants(name):
    """Layouts a config switches: Falcon-7B's multi-query qkv and its classic interleaved one
    (with ALiBi), OPT-350m's post-norm, GPT-BigCode without multi-query: F against the
    raw-weight oracle."""
    model = make(name)
    anatomy = sh.anatomy_of(model)
    assert anatomy.n_kv_heads == (1 if name == "falcon_mq" else 4)
    if name == "opt_post":
        assert anatomy.norm_placement == "post" and anatomy.layers[0].attn_norm is None
    check_F(model, *RAW[name])


def test_fused_layouts_read_kv_groups():
    """Falcon's grouped and multi-query layouts, Phi3's GQA and GPT-BigCode's multi-query
    expand to H heads (the F oracle above checks the values themselves)."""
    assert sh.anatomy_of(make("falcon")).n_kv_heads == 2
    assert sh.anatomy_of(make("gpt_bigcode")).n_kv_heads == 1
    anat = sh.anatomy_of(make("phi3"))
    assert anat.n_kv_heads == 2 and anat.layers[0].value_weights().shape == (4, 8, 32)


@pytest.mark.parametrize("name", ["falcon", "mpt"])
def test_power_view_on_fused_layouts(name):
    """probe.analyze().power: |lambda_1| of each layer's F equals the eig of the raw-weight
    least-squares F."""
    model = make(name)
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_ids(length=6))
    power = probe.analyze().power
    value_in, output = RAW[name]
    for layer, part in enumerate(probe.anatomy.layers):
        F = oracle_F(model, part.block, value_in, output, 32)
        want = np.abs(np.linalg.eigvals(F.numpy())).max()
        assert power.abs_lambda1[layer] == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("name", ["bloom", "falcon_alibi"])
def test_own_attention_replays_single_query_on_concatenated_keys(name):
    """BLOOM and Falcon (here with ALiBi) compute attention in their own code: never the split
    core (which knows no ALiBi); the concatenated-keys replay is exact at an interior token."""
    model = make(name)
    with sh.instrument(model) as probe, torch.no_grad():
        model(**_ids(length=6))
    op = block_jacobian(probe.anatomy, probe.recording, 0, position=2)
    assert op.single_query_mode == "concat"
    op.to_dense()
    assert op.engine.method_used == "linearize"  # forward AD, no finite differences
    # BLOOM's GeLU autograd.Function was swapped for its formula during the replay only
    assert all("forward" not in m.__dict__ for m in model.modules())
    check_jacobian(probe, k=2, position=2, oracle_mode=ORACLE_MODE.get(name, "forward"))
