"""Block JVPs and VJPs (the transposed traced graph) replayed from CUDA graphs
(linearize/cuda_graphs.py) give the numbers of the direct application and of the dense
forward-mode oracle, and are really replayed. Needs a CUDA device (benchmarks/gpu_session.sh
runs it there); skipped elsewhere."""

import warnings

import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.errors import FallbackWarning
from spectral_hooks.linearize import cuda_graphs
from tests.tiny_models import make_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def probe():
    model = make_model("llama", dtype=torch.float32).to("cuda")
    with sh.instrument(model) as probe:
        with torch.no_grad():
            model(torch.arange(1, 9, device="cuda")[None])
        yield probe


def _products(probe, layer: int):
    op = probe.jacobian(layer)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(op.shape[1], 32, generator=g, dtype=torch.float64).to("cuda")
    return op, (op.matmat(X), op.matvec(X[:, 0]), op.rmatvec(X[:, 1]), op.matmat(X[:, :1]),
                op.rmatmat(X[:, 2:3]), op.rmatmat(X[:, :4]))


def test_replays_equal_direct_application_and_dense_oracle(probe, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # every capture succeeded, no vmap loss
        op, replayed = _products(probe, 1)
        again = _products(probe, 1)[1]  # replays on a second operator and second calls
    engine = op.engine
    assert sorted(engine._blocks) == [1, 32] and sorted(engine._vblocks) == [1, 32]
    assert all(f.__name__ == "replay" for f in [*engine._blocks.values(),
                                                 *engine._vblocks.values()])
    monkeypatch.setattr(cuda_graphs, "CUDA_GRAPHS", False)
    direct = _products(probe, 1)[1]
    for r, a, d in zip(replayed, again, direct):
        torch.testing.assert_close(r, d, rtol=1e-12, atol=1e-14)
        assert torch.equal(r, a)
    J = probe.dense_jacobian(1).to("cuda")
    X = torch.randn(J.shape[1], 32, generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64).to("cuda")
    torch.testing.assert_close(replayed[0], J @ X, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(replayed[2], J.T @ X[:, 1], rtol=1e-10, atol=1e-12)


def test_eigs_on_replayed_operator_matches_dense_eig(probe):
    J = probe.dense_jacobian(0).to(torch.float64)
    want = torch.linalg.eigvals(J.cpu())
    want = want[want.abs().argsort(descending=True)][:6]
    got = sh.eigs(probe.jacobian(0), 6, tol=1e-10).values.cpu()
    got = got[got.abs().argsort(descending=True)]
    assert torch.cdist(torch.view_as_real(got), torch.view_as_real(want)).min(1).values.max() \
        <= 1e-8 * want.abs().max()
