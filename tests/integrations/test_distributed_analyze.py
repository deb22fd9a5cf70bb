"""probe.analyze(distributed=True) on a real 2-process gloo group equals one process, table for
table and bit for bit (power, spectra, jacobian, trends); mismatched recordings raise on every
rank; outside a process group it is a clear OptionError."""

import pickle
from pathlib import Path

import pandas as pd
import pytest
import torch

from . import _dist_analyze_worker as worker
from . import spawn


def run(out: Path, world: int, timeout: float = 180.0) -> None:
    spawn.run_ranks(worker.__file__, world, out, timeout=timeout, pass_port=True,
                    env={"TQDM_DISABLE": "1"})


def test_two_ranks_equal_one_process(tmp_path):
    run(tmp_path, 1)
    run(tmp_path, 2)
    single = pickle.loads((tmp_path / "single.pkl").read_bytes())
    ranks = [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(2)]
    assert set(single["tables"]) == {"power", "spectra", "jacobian", "trends"}
    for result in ranks:
        assert list(result["tables"]) == list(single["tables"])
        for name, table in single["tables"].items():
            pd.testing.assert_frame_equal(result["tables"][name], table, check_exact=True,
                                          obj=name)
        info = result["meta"]["distributed"]
        assert info["world_size"] == 2
        assert [r["layers"] for r in info["ranks"]] == [[0, 2, 4], [1, 3]]
        assert result["meta"]["options"] == single["meta"]["options"]
        assert "differ" in result["mismatch"], result["mismatch"]
    assert sorted(single["tables"]["jacobian"]["layer"].unique()) == [0, 1, 2, 3, 4]


def test_distributed_needs_a_process_group():
    from spectral_hooks.errors import OptionError

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        pytest.skip("a process group is already initialised")
    probe = worker.record(worker.make_model(), worker.inputs())
    with pytest.raises(OptionError, match="init_process_group"):
        probe.analyze(power=True, distributed=True)
    with pytest.raises(OptionError, match="distributed"):
        probe.analyze(power=True, distributed="yes")
