"""A slower path is never silent: a FallbackWarning (once per cause) and the report's metadata."""

import warnings

import torch
from torch import nn

import spectral_hooks as sh
from spectral_hooks.errors import FallbackWarning
from tests.tiny_models import make_model


class _TanhWithoutForwardAD(torch.autograd.Function):
    """tanh with a backward but no jvp: forward-mode AD through it fails."""

    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


class _Act(nn.Module):
    def forward(self, x):
        return _TanhWithoutForwardAD.apply(x)


def test_a_fallback_is_warned_and_listed_in_the_metadata():
    sh.errors._warned.clear()  # warnings are once per process: start this test afresh
    model = make_model("gpt2")
    model.h[1].mlp.act = _Act()
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(0)))
    report = probe.analyze(power=False, jacobian={"k": 3, "dense": True})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = report.jacobian
    causes = report.metadata["fallbacks"]
    assert causes and all(c.startswith("linearize.") for c in causes), causes
    warned = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(warned) == len(causes) and all(any(c in m for m in warned) for c in causes)
    assert table.layer.tolist() == [0, 1]
    # the slower path is still right: reverse-mode dense J vs central differences of the block
    J = probe.dense_jacobian(1)
    J_fd = probe.jacobian(1, method="finite_difference").matmat(
        torch.eye(J.shape[0], dtype=J.dtype))
    torch.testing.assert_close(J, J_fd, rtol=1e-6, atol=1e-8)
