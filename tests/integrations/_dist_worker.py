"""One rank of the 2-process all_reduce_stats test (run by test_distributed.py).

    python _dist_worker.py RANK WORLD_SIZE PORT OUT_DIR
"""

import sys
from datetime import timedelta

import torch

CAPTURE = ("resid_pre", "resid_post")


def make_model():
    # float64 forward: float32 GEMMs differ at 1e-7 between thread counts (workers use 1)
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    return GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=64,
                                bos_token_id=0, eos_token_id=0)).eval().double()


def batches():
    """Five batches of different sizes and lengths, some rows padded."""
    g = torch.Generator().manual_seed(3)
    out = []
    for i, (b, n) in enumerate([(3, 7), (2, 11), (4, 5), (1, 9), (2, 6)]):
        ids = torch.randint(0, 100, (b, n), generator=g)
        mask = torch.ones(b, n, dtype=torch.long)
        if b > 1:
            mask[0, n - 1 - i % 3:] = 0  # right padding on the first row
        out.append((ids, mask))
    return out


def record(model, parts):
    import spectral_hooks as sh

    with sh.instrument(model, capture=CAPTURE, store="stats") as probe, torch.no_grad():
        for ids, mask in parts:
            model(input_ids=ids, attention_mask=mask)
    return probe


def main(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from spectral_hooks.integrations import all_reduce_stats

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=30))
    try:
        probe = record(make_model(), batches()[rank::world])  # each rank: different batches
        stats = all_reduce_stats(probe.recording)
        torch.save({k: (s.count, s.mean, s.cov) for k, s in stats.items()}, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
