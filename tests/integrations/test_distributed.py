"""all_reduce_stats on a real 2-process gloo group equals one recording over all batches."""

from pathlib import Path

import pytest
import torch

from . import _dist_worker as worker
from . import spawn

WORLD = 2


def run_ranks(out: Path, timeout: float = 120.0) -> None:
    spawn.run_ranks(worker.__file__, WORLD, out, timeout=timeout, pass_port=True)


def test_all_reduce_stats_matches_single_process(tmp_path):
    run_ranks(tmp_path)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    reference = worker.record(worker.make_model(), worker.batches()).recording
    keys = {(c, l) for c in worker.CAPTURE for l in reference.layers}
    for result in results:
        assert set(result) == keys
        for key in keys:
            count, mean, cov = result[key]
            ref = reference.stats(*key)
            assert count == ref.count
            assert mean.dtype == cov.dtype == torch.float64
            torch.testing.assert_close(mean, ref.mean, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(cov, ref.cov, rtol=1e-9, atol=1e-12)
    # both ranks got the same answer, and it differs from either rank's own statistics
    for key in keys:
        assert torch.equal(results[0][key][1], results[1][key][1])
    part = worker.record(worker.make_model(), worker.batches()[0::WORLD]).recording
    assert part.stats("resid_post", 1).count < reference.stats("resid_post", 1).count


def test_all_reduce_stats_needs_a_process_group():
    from spectral_hooks.integrations import all_reduce_stats

    if torch.distributed.is_initialized():
        pytest.skip("a process group is already initialised")
    with pytest.raises(RuntimeError, match="init_process_group"):
        all_reduce_stats(worker.record(worker.make_model(), worker.batches()[:1]))
