"""accelerate: a tiny model offloaded to disk (``disk_offload``: every weight on the meta device,
brought in by accelerate's hooks) is recorded, and its power metrics (report and training event)
equal the plain model's, weights brought in one block at a time; its Jacobian view and an
``init_empty_weights`` model are refused in one sentence. The same for a tiny model loaded with
``from_pretrained(device_map="auto")`` under a CPU memory budget smaller than the model."""

import math

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import UnsupportedModelError
from spectral_hooks.integrations.power_log import power_metrics
from tests.tiny_models import make_model

accelerate = pytest.importorskip("accelerate")
IDS = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
COLUMNS = ("abs_lambda1", "gap_ratio", "gamma", "lift", "erank")


def _analysed(model) -> dict:
    with sh.instrument(model) as probe, torch.no_grad():
        model(IDS)
        out = {"power": probe.analyze(power=True, progress=False).power[list(COLUMNS)],
               "event": power_metrics(probe, columns=COLUMNS)}
        try:
            out["jacobian"] = probe.analyze(power=False, jacobian={"k": 4, "dense": True},
                                            progress=False).jacobian["top_eig_abs"].tolist()
        except UnsupportedModelError as err:
            out["jacobian"] = str(err)
    return out


def test_disk_offload_is_analysed_like_the_plain_model(tmp_path):
    reference = _analysed(make_model("gpt2").eval())
    model = make_model("gpt2").eval()
    accelerate.disk_offload(model, str(tmp_path / "offload"), execution_device="cpu")
    assert model.h[0].attn.c_attn.weight.device.type == "meta"  # really offloaded
    got = _analysed(model)
    assert got["power"].equals(reference["power"])
    assert got["event"] == reference["event"]
    assert isinstance(reference["jacobian"], list) and all(map(math.isfinite,
                                                               reference["jacobian"]))
    assert got["jacobian"].startswith("the Jacobian view of a model with accelerate-offloaded")
    assert model.h[0].attn.c_attn.weight.device.type == "meta"  # sent back


def test_init_empty_weights_is_refused_in_one_sentence():
    from transformers import GPT2Config, GPT2LMHeadModel

    with accelerate.init_empty_weights():
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100))
    with pytest.raises(UnsupportedModelError, match="meta device .*init_empty_weights"):
        sh.layer_matrices(model)


def test_device_map_auto_with_offload_is_analysed_like_the_plain_model(tmp_path):
    """``device_map="auto"`` with CPU offload. On a machine without a GPU the CPU is the
    execution device, so CPU offload is a no-op: what the CPU cannot hold goes to disk. With
    ``max_memory={"cpu": 60% of the model}`` accelerate keeps the embeddings in memory on the
    CPU and offloads the blocks and the final norm to disk (their weights are on the meta
    device, brought in by accelerate's hooks, read from the saved safetensors file). Analysed
    (report, training event) exactly like the plain model; the Jacobian view is refused in one
    sentence."""
    from transformers import AutoModel

    plain = make_model("gpt2").eval()
    plain.save_pretrained(tmp_path / "saved")
    reference = _analysed(plain)
    size = sum(p.numel() * p.element_size() for p in plain.parameters())
    model = AutoModel.from_pretrained(tmp_path / "saved", device_map="auto", dtype=torch.float64,
                                      max_memory={"cpu": int(0.6 * size)},
                                      offload_folder=str(tmp_path / "offload")).eval()
    placed = set(model.hf_device_map.values())
    assert placed == {"cpu", "disk"}, model.hf_device_map  # really offloaded, in part
    assert model.h[0].attn.c_attn.weight.device.type == "meta"
    got = _analysed(model)
    assert got["power"].equals(reference["power"])
    assert got["event"] == reference["event"] and got["event"]
    assert got["jacobian"].startswith("the Jacobian view of a model with accelerate-offloaded")
    assert model.h[0].attn.c_attn.weight.device.type == "meta"  # sent back
