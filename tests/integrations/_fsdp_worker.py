"""One rank of test_fsdp.py: a tiny GPT-2 sharded with FSDP2 (``fully_shard`` per block and at
the root, gloo on CPU) is instrumented and analysed on every rank; the unsharded twin is the
reference. Writes what each rank computed.

    python _fsdp_worker.py RANK WORLD_SIZE OUT_DIR
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

COLUMNS = ("abs_lambda1", "gap_ratio", "gamma", "lift", "erank")


def make_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                      n_positions=64, bos_token_id=0, eos_token_id=0,
                                      attn_implementation="eager")).eval().double()


def analyse(model, ids, *, jacobian: bool) -> dict:
    import spectral_hooks as sh
    from spectral_hooks.errors import UnsupportedModelError
    from spectral_hooks.integrations import SpectralTracker
    from spectral_hooks.integrations.power_log import power_metrics

    probe = sh.instrument(model)
    with torch.no_grad():
        model(ids)
    out = {"power_metrics": power_metrics(probe, columns=COLUMNS)}
    out["power"] = probe.analyze(power=True, progress=False).power[list(COLUMNS)].to_dict("list")
    out["jacobian"] = None  # the unsharded Jacobian is tested elsewhere: only the refusal here
    if jacobian:
        try:
            probe.analyze(power=False, jacobian={"k": 4, "dense": True}, progress=False)
        except UnsupportedModelError as err:
            out["jacobian"] = str(err)
    out["fold_norm"] = probe.analyze(power=True, fold_norm=True,
                                     progress=False).power["gap_ratio"].tolist()
    out["cached"] = probe.analyze(power=True, progress=False).power["gap_ratio"].tolist()
    probe.remove()
    tracker = SpectralTracker(model, every=1, columns=COLUMNS)  # rank 0 computes, all gather
    with torch.no_grad():
        model(ids)
    out["tracker"] = tracker.step(1)
    tracker.close()
    return out


def main(rank: int, world: int, out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", rank=rank, world_size=world)
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(5))
    reference = analyse(make_model(), ids, jacobian=False)
    model = make_model()
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    sharded = type(model.transformer.h[0].attn.c_attn.weight).__name__
    result = analyse(model, ids, jacobian=True)
    torch.save({"reference": reference, "sharded": result, "param_type": sharded},
               Path(out) / f"fsdp{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
