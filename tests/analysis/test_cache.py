"""One cache per probe: hits when nothing changed, never stale after a weight update."""

import copy

import pandas as pd
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.analysis.cache import AnalysisCache
from tests.tiny_models import make_model

IDS = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(0))


def _recorded(dtype=torch.float64):
    model = make_model("gpt2", dtype=dtype)
    probe = sh.instrument(model)
    with torch.no_grad():
        model(IDS)
    return model, probe


def _fresh_power(model):
    """The power table from a new probe (no cache) on the same inputs: the oracle."""
    with sh.instrument(model) as probe, torch.no_grad():
        model(IDS)
    return probe.analyze().power


def _train_step(model, optimizer):
    model(IDS).last_hidden_state.pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_a_lookup_with_nothing_changed_is_a_hit():
    model, probe = _recorded()
    first = probe.analyze().power
    assert probe.analyze().power is first
    probe.remove()


UPDATES = {
    "steer": None,  # handled in its own test (a context)
    "sgd_plain": lambda m: _train_step(m, torch.optim.SGD(m.parameters(), lr=0.1,
                                                          foreach=False)),
    "adamw_foreach": lambda m: _train_step(m, torch.optim.AdamW(m.parameters(), lr=1e-2,
                                                                foreach=True)),
    "adamw_fused": lambda m: _train_step(m, torch.optim.AdamW(m.parameters(), lr=1e-2,
                                                              fused=True)),
    "load_state_dict": lambda m: m.load_state_dict(
        make_model("gpt2", seed=7, dtype=next(m.parameters()).dtype).state_dict()),
    "to_dtype": lambda m: m.to(torch.float32),
    "data_whole_tensor": lambda m: m.h[1].attn.c_proj.weight.data.mul_(3.0),
    "data_assignment": lambda m: setattr(m.h[0].attn.c_proj.weight, "data",
                                         m.h[0].attn.c_proj.weight.data * 2),
}


@pytest.mark.parametrize("update", [u for u in UPDATES if u != "steer"])
def test_never_stale_after_an_update(update):
    dtype = torch.float32 if update == "adamw_fused" else torch.float64
    model, probe = _recorded(dtype)
    before = probe.analyze().power
    UPDATES[update](model)
    after = probe.analyze().power
    oracle = _fresh_power(model)
    probe.remove()
    assert after is not before  # a miss: recomputed from the new weights
    if update != "to_dtype":  # the tiny models' weights are float32-representable
        assert not after.abs_lambda1.equals(before.abs_lambda1)
    torch.testing.assert_close(torch.tensor(after.abs_lambda1.to_numpy()),
                               torch.tensor(oracle.abs_lambda1.to_numpy()), rtol=1e-6, atol=0)


def test_never_stale_inside_and_after_steer():
    model, probe = _recorded()
    before = probe.analyze().power.abs_lambda1.tolist()
    u = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with sh.steer(model, u, gap=0.1):
        steered = probe.analyze().power.abs_lambda1.tolist()
        assert steered == _fresh_power(model).abs_lambda1.tolist()
    assert steered[-1] != before[-1]
    assert probe.analyze().power.abs_lambda1.tolist() == before
    probe.remove()


def test_a_new_recording_invalidates():
    model, probe = _recorded()
    before = probe.analyze().power
    probe.clear()
    with torch.no_grad():
        model(IDS[:, :4])
    after = probe.analyze().power
    probe.remove()
    assert after is not before and int(after.n_tokens[0]) == 8


def test_invalidate_covers_the_documented_blind_spot():
    model, probe = _recorded()
    before = probe.analyze().power
    weight = model.h[1].attn.c_proj.weight
    weight.data.view(-1)[1] += 5.0  # one element outside the strided sample, no _version bump
    assert probe.analyze().power is before  # the documented limit of the fingerprint
    probe.invalidate()
    after = probe.analyze().power
    probe.remove()
    assert after.abs_lambda1.tolist() == _fresh_power(model).abs_lambda1.tolist()
    assert after.abs_lambda1[1] != before.abs_lambda1[1]


def test_fingerprint_reads_a_small_sample_of_the_weights():
    model = make_model("gpt2")
    cache = AnalysisCache(model, sh.instrument(model).recording)
    meta, samples = cache._fingerprint()
    assert len(meta) == len(list(model.parameters())) + len(list(model.buffers()))
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(len(s) if isinstance(s, bytes) else s.numel() for s in samples) < 0.2 * n_bytes


def test_no_lru_cache_in_the_package():
    from pathlib import Path

    root = Path(sh.__file__).parent
    assert not [p for p in root.rglob("*.py") if "lru_cache" in p.read_text()]


def test_deepcopied_model_gets_its_own_state():
    model, probe = _recorded()
    clone = copy.deepcopy(model)
    clone.h[0].attn.c_proj.weight.data.mul_(2)
    assert probe.analyze().power.abs_lambda1.tolist() == _fresh_power(model).abs_lambda1.tolist()
    probe.remove()


def test_block_operators_are_working_memory_bounded_and_results_unchanged(monkeypatch):
    # each block operator holds float64 copies of its block's weights: a section over every
    # layer keeps at most OPERATORS_KEPT alive (all 32 of a Llama-3-8B made 75 GiB on a GPU);
    # the tables equal those computed with every operator kept
    import gc
    import weakref

    from spectral_hooks.analysis import jacobian as view

    made = []
    build = view.block_jacobian

    def tracked(*args, **kwargs):
        op = build(*args, **kwargs)
        made.append(weakref.ref(op))
        return op

    monkeypatch.setattr(view, "block_jacobian", tracked)
    model = make_model("llama")  # 2 layers x 2 positions: 4 operators, split single-query
    tables = {}
    for kept in (1, 100):  # the per-layer path (layer groups hold their own operator, below)
        monkeypatch.setattr(view, "OPERATORS_KEPT", kept)
        made.clear()
        with sh.instrument(model) as probe, torch.no_grad():
            model(IDS)
            report = probe.analyze(power=False, jacobian={"dense": False, "k": 4,
                                                          "positions": [-1, -2],
                                                          "group_layers": False},
                                   progress=False)
            tables[kept] = report.jacobian
            gc.collect()
            alive = sum(ref() is not None for ref in made)
            assert len(made) >= 4 and alive == min(kept, len(made))
    assert tables[1].equals(tables[100])
    made.clear()
    with sh.instrument(model) as probe, torch.no_grad():  # layer groups: nothing left behind
        model(IDS)
        grouped = probe.analyze(power=False, jacobian={"dense": False, "k": 4,
                                                       "positions": [-1, -2]},
                                progress=False).jacobian
        gc.collect()
        assert sum(ref() is not None for ref in made) == 0
    cols = [c for c in tables[1].columns if c not in ("n_matvecs",) and c in grouped.columns]
    pd.testing.assert_frame_equal(grouped[cols].reset_index(drop=True),
                                  tables[1][cols].reset_index(drop=True), rtol=1e-6)
