"""all_reduce_stats on a real 2-process gloo group equals one recording over all batches."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from . import _dist_worker as worker

WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(out: Path, timeout: float = 120.0) -> None:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    procs = [subprocess.Popen([sys.executable, worker.__file__, str(rank), str(WORLD), str(port),
                               str(out)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for rank in range(WORLD)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        pytest.fail("distributed workers timed out")
    finally:
        for proc in procs:  # only the processes this test started
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"


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
