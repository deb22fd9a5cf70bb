"""One rank of test_ddp_tracker.py: a DDP plain loop trained twice (with a SpectralTracker on the
DDP-wrapped model, then without); writes its final weights, its logger's file, the tokens it
recorded at each logged step and (rank 0) the layer factors and its own-batch-only metrics.
Then two extra events: rank 1 recorded nothing (rank 0's tokens only), no rank recorded
anything (None everywhere, no hang); then the ranks instrument different layers (refused on
every rank, no hang). The ranks see different batches of different sizes.

    python _ddp_tracker_worker.py RANK WORLD_SIZE OUT_DIR
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel

from spectral_hooks.integrations import JSONLLogger, SpectralTracker
from spectral_hooks.integrations.power_log import power_metrics

STEPS, EVERY = 4, 2
DATA = ("gamma_in", "gamma", "lift", "gamma2_in", "gamma2", "rho", "rho_pvalue", "n_tokens",
        "mean_cos", "collapse_residual", "erank")
WEIGHTS = ("abs_lambda1", "gap_ratio", "gamma_null", "subspace_dim")
COLUMNS = WEIGHTS + DATA


def snapshot(tracker, rank: int) -> dict:
    """What the single-process reference needs: this rank's tokens, rank 0's factors and the
    metrics rank 0 computes from its own batch alone."""
    probe = tracker.probe
    rec = probe.recording
    out = {"tokens": {(c, layer): rec.tokens(c, layer).to(torch.float64).clone()
                      for c in ("resid_pre", "resid_post") for layer in rec.layers}}
    if rank == 0:
        out["factors"] = {layer: (probe.anatomy.layers[layer].output_weights().clone(),
                                  probe.anatomy.layers[layer].value_weights().clone())
                          for layer in rec.layers}
        with torch.no_grad():
            out["local"] = power_metrics(probe, columns=COLUMNS)
    return out


def mismatch(model, rank: int, data) -> str:
    """The ranks instrument different layers: the token exchange refuses on every rank."""
    import spectral_hooks as sh
    from spectral_hooks.integrations.distributed import token_counts

    with sh.instrument(model, layers=[rank]) as probe, torch.no_grad():
        model(data[:1])
        try:
            token_counts(probe.recording, ["resid_pre", "resid_post"])
        except ValueError as err:
            return str(err)
    return "no error"


def train(rank: int, out: Path, track: bool) -> dict:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                       n_positions=64, bos_token_id=0, eos_token_id=0))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    rows = 4 if rank == 0 else 3  # unequal token counts per rank
    data = torch.randint(0, 100, (16, 8), generator=torch.Generator().manual_seed(1 + rank))
    tracker = SpectralTracker(ddp, every=EVERY, columns=COLUMNS,
                              loggers=[JSONLLogger(out / f"rank{rank}.jsonl")]) if track else None
    snapshots = {}
    for step in range(1, STEPS + 1):
        batch = data[(step - 1) * rows:step * rows]
        ddp(batch, labels=batch).loss.backward()
        if tracker is not None:
            if tracker.due(step):
                snapshots[step] = snapshot(tracker, rank)
            snapshots.setdefault("returned", {})[step] = tracker.step(step)
        optimizer.step()
        optimizer.zero_grad()
    if tracker is not None:
        tracker.start_step(EVERY)  # a logging step: its forwards are recorded
        with torch.no_grad():
            model(data[:2])
        if rank == 1:
            tracker.probe.clear()  # rank 1 recorded nothing: rank 0's tokens alone
        snapshots["rank1_empty"] = snapshot(tracker, rank) if rank == 0 else None
        snapshots["rank1_empty_returned"] = tracker.metrics()
        tracker.probe.clear()  # no rank recorded anything
        snapshots["nobody_returned"] = tracker.metrics()
        tracker.close()
        snapshots["mismatch"] = mismatch(model, rank, data)
        torch.save(snapshots, out / f"snapshots{rank}.pt")
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
