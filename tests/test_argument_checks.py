"""One dialect of argument checks (spectral_hooks/checks.py): given "2" where an int belongs,
every public entry point raises the same exception class, OptionTypeError (a TypeError and a
ValueError), with one line naming the argument and the value; a model or a large tensor in a
message is named by its type and shape, never its repr.

tests/reliability/test_argument_validation.py covers every entry point's other bad arguments.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from transformers import GPT2Config, GPT2Model

import spectral_hooks as sh
from spectral_hooks.checks import check_float, check_int, checked_layer
from spectral_hooks.errors import LayerIndexError, OptionError, OptionTypeError
from spectral_hooks.integrations.hf_trainer import SpectralCallback
from spectral_hooks.integrations.tracker import SpectralTracker
from spectral_hooks.linalg import DenseOperator
from spectral_hooks.metrics.bottleneck import bottleneck_table, propagation_table
from spectral_hooks.metrics.community_gain import community_table
from spectral_hooks.metrics.jacobian import jacobian_metrics
from spectral_hooks.metrics.jacobian_nulls import expected_real_eigenvalues
from spectral_hooks.metrics.rank_estimates import rank_estimates
from spectral_hooks.metrics.topology import amplification, communities, topology_tables, unit_graph


@pytest.fixture(scope="module")
def c():
    model = GPT2Model(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50)).eval()
    with sh.instrument(model) as probe, torch.no_grad():
        model(torch.tensor([[1, 2, 3, 4, 5]]))
    X = torch.randn(12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    A = torch.randn(10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return SimpleNamespace(model=model, probe=probe, X=X, A=A, graph=unit_graph(X, top_k=2))


# (entry point, the argument given "2", the call)
TWO = [
    ("Probe.analyze", "jacobian.k", lambda c: c.probe.analyze(jacobian={"k": "2"})),
    ("Probe.analyze", "power.k", lambda c: c.probe.analyze(power={"k": "2"})),
    ("Probe.analyze", "reinit_seeds", lambda c: c.probe.analyze(reinit_seeds="2")),
    ("Probe.jacobian", "layer", lambda c: c.probe.jacobian("2")),
    ("steer", "layer", lambda c: sh.steer(c.model, torch.ones(16), layer="2")),
    ("eigs", "k", lambda c: sh.eigs(c.A, "2")),
    ("svds", "k", lambda c: sh.svds(c.A, "2")),
    ("unit_graph", "top_k", lambda c: unit_graph(c.X, top_k="2")),
    ("communities", "seed", lambda c: communities(c.graph, seed="2")),
    ("topology_tables", "n_shuffles", lambda c: topology_tables(
        {0: c.X}, {0: torch.ones(6)}, n_shuffles="2")),
    ("amplification", "n_samples", lambda c: amplification(DenseOperator(c.A), n_samples="2")),
    ("rank_estimates", "n_probes", lambda c: rank_estimates(c.A, n_probes="2")),
    ("jacobian_metrics", "k", lambda c: jacobian_metrics(DenseOperator(c.A), k="2")),
    ("bottleneck_table", "k", lambda c: bottleneck_table([c.A, c.A], k="2")),
    ("propagation_table", "start_layer", lambda c: propagation_table([c.A], start_layer="2")),
    ("community_table", "n_shuffles", lambda c: community_table(pd.DataFrame(columns=[
        "layer", "unit", "community", "bridge_score", "amplification", "log_gain",
        "log_gain_init"]), n_shuffles="2")),
    ("expected_real_eigenvalues", "d", lambda c: expected_real_eigenvalues("2")),
    ("SpectralCallback", "every", lambda c: SpectralCallback(every="2")),
    ("SpectralTracker", "every", lambda c: SpectralTracker(c.model, every="2")),
]


@pytest.mark.parametrize("call", [t[2] for t in TWO], ids=[f"{t[0]}:{t[1]}" for t in TWO])
def test_a_str_where_an_int_belongs_is_one_option_type_error(c, call, request):
    argument = request.node.callspec.id.split(":")[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(OptionTypeError) as info:
            call(c)
    message = str(info.value)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert f"{argument}='2' is not valid: expected " in message, message
    assert "\n" not in message


def test_the_kinds_of_bad_input():
    with pytest.raises(OptionTypeError):
        check_int("k", 2.0)
    with pytest.raises(OptionError) as out_of_range:
        check_int("k", 0, minimum=1)
    assert not isinstance(out_of_range.value, TypeError)  # a bad value, not a bad type
    with pytest.raises(OptionTypeError):
        check_float("tol", True)
    with pytest.raises(OptionError, match=r"tol=nan is not valid: expected a float in \(0, 1\)"):
        check_float("tol", float("nan"), above=0, below=1)
    with pytest.raises(LayerIndexError, match="layer=4 is out of range"):
        checked_layer(4, 4)
    assert check_int("k", torch.tensor(3).numpy()[()]) == 3  # a NumPy int is an int


def test_a_model_or_a_large_tensor_is_named_by_type_and_shape(c):
    with pytest.raises(OptionTypeError) as model_given:
        unit_graph(c.model)
    assert str(model_given.value).startswith("X=a GPT2Model module is not valid: expected ")
    with pytest.raises(OptionError) as tensor_given:
        unit_graph(torch.zeros(4, 5, 6))
    assert str(tensor_given.value).startswith(
        "X=a torch.float32 tensor of shape (4, 5, 6) is not valid: expected ")
    with pytest.raises(OptionTypeError) as options_given:
        c.probe.analyze(c.model)
    assert "a GPT2Model module" in str(options_given.value)
    assert len(str(options_given.value).splitlines()) == 1
