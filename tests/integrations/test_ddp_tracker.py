"""A 2-process gloo DDP loop with SpectralTracker on the DDP-wrapped model: only rank 0 logs,
training is bit-identical with and without the tracker on every rank, and nothing hangs."""

import json
from pathlib import Path

import torch

from . import spawn

WORLD = 2


def test_ddp_plain_loop_logs_once_and_changes_nothing(tmp_path):
    spawn.run_ranks(Path(__file__).with_name("_ddp_tracker_worker.py"), WORLD, tmp_path,
                    timeout=300)
    rank0 = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rank0] == [2, 4]
    assert (tmp_path / "rank1.jsonl").read_text() == ""  # rank 1 never logs
    for rank in range(WORLD):
        saved = torch.load(tmp_path / f"weights{rank}.pt")
        for name, tensor in saved["with"].items():
            assert torch.equal(tensor, saved["without"][name]), (rank, name)
