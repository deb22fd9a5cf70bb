"""A real transformers ``Trainer`` under 2-process DDP (gloo, CPU, ranks set up from
RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT as torchrun does) with
``SpectralCallback(...).attach(trainer)`` and ``report_to=["tensorboard"]``: the spectral
scalars reach the Trainer's own event files once per due step (rank 0 only: one event file,
no duplicate step), they describe both ranks' tokens (n_tokens counts the global batch), the
final weights are bit-identical with and without the callback on both ranks, and nothing
hangs (run_ranks' timeout)."""

from pathlib import Path

import pytest
import torch

from . import spawn
from ._hf_ddp_worker import COLUMNS, STEPS

WORLD = 2


def test_trainer_ddp_logs_once_and_trains_bit_identically(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spawn.run_ranks(Path(__file__).with_name("_hf_ddp_worker.py"), WORLD, tmp_path,
                    timeout=300)
    saved = [torch.load(tmp_path / f"hf{r}.pt", weights_only=False) for r in range(WORLD)]
    assert saved[0]["wrapped"] == "DistributedDataParallel"  # really DDP
    for rank, s in enumerate(saved):
        for name, tensor in s["with"].items():
            assert torch.equal(tensor, s["without"][name]), (rank, name)
            assert torch.equal(tensor, saved[0]["with"][name]), (rank, name)  # in sync
    history = saved[0]["history"]
    assert [step for step, _ in history] == [2, 4] and saved[1]["history"] == []
    # 2 ranks x 2 rows x 6 tokens per step: the global batch
    assert all(m["spectral/layer_00/n_tokens"] == WORLD * 2 * 6 for _, m in history)

    files = list((tmp_path / "with").rglob("events.out.tfevents.*"))
    assert len(files) == 1, files  # one writer: rank 0
    acc = EventAccumulator(str(files[0].parent), size_guidance={"scalars": 0})
    acc.Reload()
    spectral = {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
                for tag in acc.Tags()["scalars"] if "spectral/" in tag}
    names = {f"train/spectral/layer_{layer:02d}/{c}" for layer in (0, 1) for c in COLUMNS}
    assert names | {"train/spectral/seconds"} == set(spectral)
    for tag, events in spectral.items():
        assert [step for step, _ in events] == list(range(2, STEPS + 1, 2)), tag  # once each
        if tag in names:
            want = [m[tag.removeprefix("train/")] for _, m in history]
            assert [v for _, v in events] == pytest.approx(want, rel=1e-6), tag  # float32 TB
