import math

import numpy as np
import pytest
import torch

from spectral_hooks.linalg import effective_rank, participation_ratio, stable_rank, surviving


def _np_ranks(s):
    s = np.asarray(s, dtype=float)
    p = s / s.sum()
    h = -sum(pi * math.log(pi) for pi in p if pi > 0)
    return math.exp(h), (s ** 2).sum() ** 2 / (s ** 4).sum(), (s ** 2).sum() / s.max() ** 2


def test_flat_spectrum():
    s = torch.ones(4, dtype=torch.float64)
    for f in (effective_rank, participation_ratio, stable_rank):
        assert float(f(s)) == pytest.approx(4.0)
    assert int(surviving(s)) == 4


def test_geometric_and_unsorted_vs_numpy():
    s = 0.5 ** np.arange(10)
    er, pr, sr = _np_ranks(s)
    t = torch.tensor(s[::-1].copy())
    assert float(effective_rank(t)) == pytest.approx(er, rel=1e-12)
    assert float(participation_ratio(t)) == pytest.approx(pr, rel=1e-12)
    assert float(stable_rank(t)) == pytest.approx(sr, rel=1e-12)
    assert int(surviving(t, tau=1e-2)) == 7  # 0.5^6 = 0.0156 >= 0.01 > 0.5^7


def test_batched_zero_and_errors():
    s = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [3.0, 3.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(effective_rank(s), torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(participation_ratio(s), torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(stable_rank(s), torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64))
    assert surviving(s).tolist() == [1, 0, 2]
    with pytest.raises(ValueError, match="NaN"):
        effective_rank(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match=">= 0"):
        stable_rank(torch.tensor([1.0, -1.0]))
