"""One rank of test_ddp_tracker.py: a DDP plain loop trained twice (with a SpectralTracker on the
DDP-wrapped model, then without); writes its final weights and its logger's file."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel

from spectral_hooks.integrations import JSONLLogger, SpectralTracker

STEPS, EVERY = 4, 2


def train(rank: int, out: Path, track: bool) -> dict:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                       n_positions=64, bos_token_id=0, eos_token_id=0))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    data = torch.randint(0, 100, (16, 8), generator=torch.Generator().manual_seed(1 + rank))
    tracker = SpectralTracker(ddp, every=EVERY,
                              loggers=[JSONLLogger(out / f"rank{rank}.jsonl")]) if track else None
    for step in range(1, STEPS + 1):
        batch = data[(step - 1) * 4:step * 4]
        ddp(batch, labels=batch).loss.backward()
        if tracker is not None:
            tracker.step(step)
        optimizer.step()
        optimizer.zero_grad()
    if tracker is not None:
        tracker.close()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def main(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out_dir = Path(out)
    with_tracker = train(rank, out_dir, track=True)
    without = train(rank, out_dir, track=False)
    torch.save({"with": with_tracker, "without": without}, out_dir / f"weights{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
