"""Power view at any width: F = W_O W_V applied as two thin products (anatomy.weights.LayerOperators),
its top-k eigenpairs by linalg.eigs; checked against the dense float64 eig of F on small d by
forcing the path (power={"full": False}, or the threshold lowered)."""

import numpy as np
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.analysis import PowerOptions
from spectral_hooks.analysis import power as power_module
from spectral_hooks.anatomy.weights import layer_matrices, layer_operators
from spectral_hooks.errors import OptionError, UnknownOptionError
from spectral_hooks.metrics import spectrum as spectrum_module

COLUMNS = ["lambda1_real", "abs_lambda1", "abs_lambda2", "abs_mu1", "abs_mu2", "gap_ratio",
           "subspace_dim", "gamma_in", "gamma", "gamma2_dim", "gamma2", "rho", "mean_cos"]


def _llama():
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    model = LlamaModel(LlamaConfig(num_hidden_layers=2, hidden_size=48, intermediate_size=96,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=60)).eval()
    with torch.no_grad():  # a norm gain that is not all ones, so fold_norm matters
        for layer in model.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def probe():
    model = _llama()
    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 60, (2, 9), generator=torch.Generator().manual_seed(1)))
    yield probe
    probe.remove()


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Conjugate-invariant top-k: sorted by (|z|, |Im z|, Re z)."""
    v = values[np.lexsort((values.real, np.abs(values.imag), -np.abs(values)))][:k]
    return np.sort_complex(v.real + 1j * np.abs(v.imag))


@pytest.mark.parametrize("fold_norm", [False, True])
def test_layer_operators_equal_the_dense_layer_matrices(probe, fold_norm):
    F = layer_matrices(probe.anatomy, fold_norm=fold_norm)
    ops = layer_operators(probe.anatomy, fold_norm=fold_norm)
    assert ops.shape == tuple(F.shape) and ops.dtype == torch.float64
    for t in range(F.shape[0]):
        torch.testing.assert_close(ops[t].to_dense(), F[t], rtol=1e-12, atol=1e-14)
        y = torch.randn(F.shape[1], dtype=torch.float64)
        torch.testing.assert_close(ops[t].rmatvec(y), F[t].T @ y, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("iterate", ["F", "I+F"])
def test_matrix_free_power_view_matches_the_dense_eig(probe, iterate):
    dense = probe.analyze(iterate=iterate, fold_norm=True, progress=False)
    free = probe.analyze(iterate=iterate, fold_norm=True, power={"full": False, "k": 6},
                         progress=False)
    assert not dense.power["truncated"].any() and free.power["truncated"].all()
    assert free.power["converged"].all()
    np.testing.assert_allclose(free.power[COLUMNS].to_numpy(float),
                               dense.power[COLUMNS].to_numpy(float), rtol=1e-7, atol=1e-9)
    F = layer_matrices(probe.anatomy, fold_norm=True)
    for t in range(F.shape[0]):
        oracle = torch.linalg.eigvals(F[t]).numpy()  # the dense float64 oracle
        shift = 1 if iterate == "I+F" else 0
        rows = free.spectra[(free.spectra["layer"] == t) & (free.spectra["source"] == "F")]
        got = rows["real"].to_numpy() + 1j * rows["imag"].to_numpy()
        n = len(got)
        assert n in (6, 7)  # a conjugate pair straddling the cut adds one
        np.testing.assert_allclose(_top(got + shift, n), _top(oracle + shift, n),
                                   rtol=1e-8, atol=1e-12)


def test_threshold_chooses_the_path_and_full_forces_dense(probe, monkeypatch):
    assert probe.anatomy.d_model < spectrum_module.MATRIX_FREE_D
    monkeypatch.setattr(spectrum_module, "MATRIX_FREE_D", 32)
    formed = []
    real = power_module.layer_matrices
    monkeypatch.setattr(power_module, "layer_matrices",
                        lambda *a, **k: formed.append(1) or real(*a, **k))
    auto = probe.analyze(progress=False)
    assert formed == []  # no d x d matrix on the matrix-free path
    # GQA 4/2 heads of 12: F = A B with r = 24 < d = 48, so every eigenvalue, exactly
    assert not auto.power["truncated"].any() and len(auto.spectra) == 2 * probe.anatomy.d_model
    monkeypatch.setattr(spectrum_module, "FACTORED_EXACT_MAX", 16)  # r = 24 above it: top-k
    spectrum_module.clear_spectrum_cache()
    topk = probe.analyze(power={"k": 7}, progress=False)  # new options: not the cached table
    assert topk.power["truncated"].all() and topk.spectra["truncated"].all() and formed == []
    full = probe.analyze(power={"full": True}, progress=False)
    assert not full.power["truncated"].any()
    assert len(full.spectra) == 2 * probe.anatomy.d_model and formed


@pytest.mark.parametrize("iterate", ["F", "I+F"])
@pytest.mark.parametrize("fold_norm", [False, True])
@pytest.mark.parametrize("threshold", [2048, 32])  # d = 48 below / above the matrix-free width
def test_factored_power_view_is_the_dense_eig_exactly(probe, monkeypatch, iterate, fold_norm,
                                                     threshold):
    """A grouped-query F = A B (r = 24 < d = 48), by default at any width: every eigenvalue
    from the r x r matrix B A, no d x d matrix formed, equal to the dense float64 eig of F, and
    the same tables as the forced dense path."""
    dense = probe.analyze(iterate=iterate, fold_norm=fold_norm, power={"full": True},
                          progress=False)
    monkeypatch.setattr(spectrum_module, "MATRIX_FREE_D", threshold)
    calls, formed = [], []
    real = spectrum_module.factored_eig
    monkeypatch.setattr(spectrum_module, "factored_eig",
                        lambda op, *a: calls.append(op.rank_bound) or real(op, *a))
    real_matrices = power_module.layer_matrices
    monkeypatch.setattr(power_module, "layer_matrices",
                        lambda *a, **k: formed.append(1) or real_matrices(*a, **k))
    factored = probe.analyze(iterate=iterate, fold_norm=fold_norm,
                             power={"k": 5 if threshold > 48 else 6},
                             progress=False)  # new options: not a cached table
    assert not factored.power["truncated"].any() and factored.power["converged"].all()
    assert calls and set(calls) == {24} and formed == []  # (tables are computed when read)
    np.testing.assert_allclose(factored.power[COLUMNS].to_numpy(float),
                               dense.power[COLUMNS].to_numpy(float), rtol=1e-9, atol=1e-11)
    F = layer_matrices(probe.anatomy, fold_norm=fold_norm)
    for t in range(F.shape[0]):
        oracle = np.sort_complex(torch.linalg.eigvals(F[t]).numpy())
        rows = factored.spectra[(factored.spectra["layer"] == t)
                                & (factored.spectra["source"] == "F")]
        got = np.sort_complex(rows["real"].to_numpy() + 1j * rows["imag"].to_numpy())
        assert len(got) == F.shape[1] and int((got == 0).sum()) >= F.shape[1] - 24
        np.testing.assert_allclose(got, oracle, rtol=0, atol=1e-12 * np.abs(oracle).max())


def test_multi_head_attention_keeps_the_dense_eig_below_the_matrix_free_width(monkeypatch):
    """GPT-2 heads have their own W_V (r = d): nothing to gain from the factors, dense eig."""
    from transformers import GPT2Config, GPT2Model

    formed = []
    real = power_module.layer_matrices
    monkeypatch.setattr(power_module, "layer_matrices",
                        lambda *a, **k: formed.append(1) or real(*a, **k))
    model = GPT2Model(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=50)).eval()
    with sh.instrument(model) as probe:
        with torch.no_grad():
            model(input_ids=torch.randint(0, 50, (1, 5)))
        assert layer_operators(probe.anatomy).inner_width(0) == 32
        report = probe.analyze(progress=False)
        assert not report.power["truncated"].any() and formed == [1]


def test_power_options_are_validated():
    assert sh.AnalyzeOptions(power={"k": 4}).power_options.k == 4
    assert sh.AnalyzeOptions().power is True and sh.AnalyzeOptions(power=False).power is False
    assert sh.AnalyzeOptions(power={"full": True}).to_dict()["power"] == {
        "full": True, "k": 8, "reference_layer": None, "direction": None}
    with pytest.raises(OptionError, match="power.k"):
        sh.AnalyzeOptions(power={"k": 0})
    with pytest.raises(OptionError, match="power.full"):
        PowerOptions(full="yes")
    with pytest.raises(UnknownOptionError):
        sh.AnalyzeOptions(power={"top": 3})
    with pytest.raises(OptionError, match="power"):
        sh.AnalyzeOptions(power="full")


def test_full_eig_batched_over_layers_on_the_device(probe):
    """The path an accelerator takes (one batched eig of every layer's F on the model's
    device), run here on the CPU: the same tables as the per-layer eigs."""
    from spectral_hooks.metrics import spectrum

    reference = probe.analyze(power={"full": True}, iterate="I+F", progress=False)
    ref = {name: reference[name] for name in ("power", "spectra")}
    batches = []
    real = spectrum._batched_eigs
    spectrum.BATCHED_EIG_DEVICES.add("cpu")
    try:
        spectrum._batched_eigs = lambda *a: batches.append(r := real(*a)) or r
        probe.invalidate()
        batched = probe.analyze(power={"full": True}, iterate="I+F", progress=False)
        tables = {name: batched[name] for name in ("power", "spectra")}
    finally:
        spectrum.BATCHED_EIG_DEVICES.discard("cpu")
        spectrum._batched_eigs = real
        spectrum.clear_spectrum_cache()
        probe.invalidate()
    assert any(len(b) == probe.anatomy.n_layers for b in batches)  # one eig, every layer
    for name, table in ref.items():
        np.testing.assert_allclose(tables[name].select_dtypes("number").to_numpy(float),
                                   table.select_dtypes("number").to_numpy(float),
                                   rtol=1e-9, atol=1e-12)
