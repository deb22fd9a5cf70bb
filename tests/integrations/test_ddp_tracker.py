"""A 2-process gloo DDP loop with SpectralTracker on the DDP-wrapped model: only rank 0 logs,
training is bit-identical with and without the tracker on every rank, and nothing hangs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .test_distributed import free_port

WORLD = 2


def test_ddp_plain_loop_logs_once_and_changes_nothing(tmp_path):
    worker = Path(__file__).with_name("_ddp_tracker_worker.py")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, worker, str(rank), str(WORLD), str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in range(WORLD)]
    try:
        logs = [proc.communicate(timeout=300)[0] for proc in procs]
    except subprocess.TimeoutExpired:
        pytest.fail("DDP workers hung")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert all(proc.returncode == 0 for proc in procs), "\n".join(logs)[-4000:]
    rank0 = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rank0] == [2, 4]
    assert (tmp_path / "rank1.jsonl").read_text() == ""  # rank 1 never logs
    for rank in range(WORLD):
        saved = torch.load(tmp_path / f"weights{rank}.pt")
        for name, tensor in saved["with"].items():
            assert torch.equal(tensor, saved["without"][name]), (rank, name)
