"""FSDP2 (``fully_shard`` per block and at the root, gloo on CPU, 2 processes): instrument()
accepts the sharded model, its DTensor weights are gathered one layer at a time, the power
metrics (report and training event) equal the unsharded model's on every rank, the cache works
on shards, a SpectralTracker computes on rank 0 only without hanging, and the Jacobian view is
refused in one sentence."""

from pathlib import Path

import pytest
import torch

from . import spawn

WORLD = 2


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_fsdp2_power_metrics_equal_the_unsharded_model(tmp_path):
    pytest.importorskip("torch.distributed.fsdp", reason="no FSDP2 in this torch")
    spawn.run_ranks(Path(__file__).with_name("_fsdp_worker.py"), WORLD, tmp_path, timeout=300)
    for rank in range(WORLD):
        saved = torch.load(tmp_path / f"fsdp{rank}.pt", weights_only=False)
        assert saved["param_type"] == "DTensor"  # the model really was sharded
        ref, got = saved["reference"], saved["sharded"]
        assert got["power_metrics"] == ref["power_metrics"] and ref["power_metrics"]
        assert got["power"] == ref["power"] and got["cached"] == ref["cached"]
        assert got["fold_norm"] == ref["fold_norm"]
        assert ref["jacobian"] is None
        assert "FSDP2-sharded model is not supported" in got["jacobian"]
        if rank == 0:
            strip = lambda m: {k: v for k, v in m.items() if k != "spectral/seconds"}  # noqa
            assert strip(got["tracker"]) == strip(ref["tracker"]) and got["tracker"]
        else:
            assert got["tracker"] is None and ref["tracker"] is None
