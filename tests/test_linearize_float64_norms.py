"""Norms in the analysis dtype: Hugging Face's RMSNorms compute in float32 even in a float64
model (``anatomy.norm_upcasts``); the float64 replay keeps them in float64, whatever the model's
own dtype, so a float64 block operator is linear to rounding and equals the dense float64
oracle (tests/oracles.py, whose RMSNorms are written out in float64)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import spectral_hooks as sh
from spectral_hooks.linalg import eigs
from spectral_hooks.linearize import block_jacobian
from tests.golden.cases import tiny_batch
from tests.oracles import last_real_position, token_jacobian
from tests.profiles import quick_subset
from tests.tiny_models import make_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

UPCASTING = ("llama", "mistral", "qwen2", "gemma2", "gemma3", "olmo2")


def _record(family: str, dtype: torch.dtype):
    model = make_model(family, dtype=dtype)
    batch = tiny_batch()
    batch["attention_mask"][1] = 1
    with sh.instrument(model) as probe, torch.no_grad():
        model(**batch)
    return probe


def _hf_native_token_jacobian(probe, layer: int, p: int) -> torch.Tensor:
    """The same Jacobian with the model's own (float32-computing) norms, for contrast."""
    call = probe.recording.block_input(layer, 0)
    H0 = call.hidden.detach().to(torch.float64)[0]
    block = copy.deepcopy(probe.anatomy.layers[layer].block).to(torch.float64)

    def f(x):
        H = torch.cat([H0[:p], x[None], H0[p + 1:]], 0)[None]
        args, kwargs = call.with_hidden(H)
        cast = {k: v.to(torch.float64) if torch.is_tensor(v) and v.is_floating_point() else v
                for k, v in kwargs.items()}
        out = block(*args, **cast)
        return (out[0] if isinstance(out, tuple) else out)[0, p]

    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        return torch.func.jacfwd(f)(H0[p])


# quick profile: each family once, each dtype at least once (a Latin square); full: all 12
_F64_QUICK = {("llama", torch.float32), ("gemma2", torch.bfloat16), ("olmo2", torch.float64),
              ("qwen2", torch.bfloat16)}
_F64_CASES = [(f, d) for f in ("llama", "gemma2", "olmo2", "qwen2")
              for d in (torch.float32, torch.bfloat16, torch.float64)]


@pytest.mark.parametrize("family,dtype", quick_subset(_F64_CASES, keep=_F64_QUICK))
def test_float64_operator_is_linear_and_exact(family, dtype):
    probe = _record(family, dtype)
    assert probe.anatomy.norm_upcasts
    J = block_jacobian(probe.anatomy, probe.recording, 0)
    assert J.dtype == torch.float64
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(J.shape[0], generator=g, dtype=torch.float64) for _ in range(2))
    defect = J.matvec(x + 1e-3 * y) - J.matvec(x) - 1e-3 * J.matvec(y)
    assert float(defect.norm() / J.matvec(x).norm()) < 1e-12
    p = last_real_position(probe)
    want = token_jacobian(probe, 0, position=p)
    got = J.to_dense()
    assert float((got - want).abs().max()) < 1e-10 * float(want.abs().max())
    if dtype == torch.float64:  # the model's own float32 norms would differ from float64 ones
        native = _hf_native_token_jacobian(probe, 0, p)
        assert float((native - want).abs().max()) > 1e-12 * float(want.abs().max())


@pytest.mark.parametrize("family", UPCASTING)
def test_matrix_free_eigs_converges_on_every_layer(family):
    probe = _record(family, torch.float32)
    for layer in probe.recording.layers:
        J = block_jacobian(probe.anatomy, probe.recording, layer)
        result = eigs(J, 4, tol=1e-8, seed=0, return_vectors=False)
        assert result.converged, (family, layer)
        assert J.n_matvecs < 400, (family, layer, J.n_matvecs)


def _wide_model(family: str, dtype: torch.dtype):
    """d_model 128 (the tiny models' 32 is below what a Krylov solver needs to show)."""
    import transformers as tf

    kw = dict(vocab_size=100, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config, cls = {
        "llama": (tf.LlamaConfig, tf.LlamaModel), "qwen2": (tf.Qwen2Config, tf.Qwen2Model),
        "gemma2": (tf.Gemma2Config, tf.Gemma2Model), "olmo2": (tf.Olmo2Config, tf.Olmo2Model),
    }[family]
    extra = dict(head_dim=32, sliding_window=4) if family == "gemma2" else {}
    torch.manual_seed(0)
    return cls(config(**kw, **extra)).to(dtype).eval()


@pytest.mark.parametrize("family,dtype", quick_subset(
    _F64_CASES, keep={("llama", torch.bfloat16), ("qwen2", torch.float64),
                      ("gemma2", torch.float32), ("olmo2", torch.float32)}))
def test_matrix_free_needs_at_most_twice_arpacks_matvecs(family, dtype):
    """Issue 12: on every layer, matrix-free eigs converges to the dense top-k (1e-8,
    with multiplicity) in at most 2x the matvecs scipy ARPACK needs on the same operator,
    iterating on the operator (the default); and so does materialize="auto" (on the CPU it
    materialises these batched operators: n columns in blocks, issue 24)."""
    import numpy as np
    import scipy.sparse.linalg as sla

    from tests.oracles import assert_same_spectrum, eigvals_by_modulus

    model = _wide_model(family, dtype)
    ids = torch.randint(1, 100, (1, 9), generator=torch.Generator().manual_seed(0))
    with sh.instrument(model) as probe, torch.no_grad():
        model(ids)
    for layer in probe.recording.layers:
        J = block_jacobian(probe.anatomy, probe.recording, layer)
        dense = J.to_dense().numpy()
        for k in (4, 16):
            want = eigvals_by_modulus(dense)
            auto = eigs(J, k, tol=1e-8, seed=0, return_vectors=False, materialize="auto")
            assert bool(auto.converged), (layer, k)
            got = np.asarray(auto.values)
            assert_same_spectrum(got, want[:len(got)], 1e-8 * abs(want[0]))
            start = J.n_matvecs
            result = eigs(J, k, tol=1e-8, seed=0, return_vectors=False)
            ours = J.n_matvecs - start
            assert bool(result.converged), (layer, k)
            got = np.asarray(result.values)
            assert_same_spectrum(got, want[:len(got)], 1e-8 * abs(want[0]))
            calls = [0]

            def matvec(x, calls=calls):
                calls[0] += 1
                return dense @ np.asarray(x).ravel()

            A = sla.LinearOperator(dense.shape, matvec=matvec, dtype=np.float64)
            sla.eigs(A, k=k, tol=1e-8, return_eigenvectors=False, v0=np.ones(dense.shape[0]))
            assert ours <= 2 * calls[0], (layer, k, ours, calls[0])
