"""One rank of the 2-process ``probe.analyze(distributed=True)`` test (test_distributed_analyze.py).

    python _dist_analyze_worker.py RANK WORLD_SIZE PORT OUT_DIR

WORLD_SIZE 1 is the single-process reference: a plain ``probe.analyze`` with no process group,
in a process of its own so that it runs with the same single thread as the ranks.
"""

import pickle
import sys
from datetime import timedelta

import torch

OPTIONS = dict(power=True, jacobian={"k": 4}, progress=False)


def make_model():
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    return GPT2Model(GPT2Config(n_layer=5, n_embd=32, n_head=4, vocab_size=100, n_positions=64,
                                bos_token_id=0, eos_token_id=0)).eval().double()


def inputs(seed: int = 3):
    return torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(seed))


def record(model, ids):
    import spectral_hooks as sh

    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=ids)
    return probe


def tables(report) -> dict:
    return {name: report[name] for name in report.sections}


def main(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    model = make_model()
    if world == 1:
        report = record(model, inputs()).analyze(**OPTIONS)
        with open(f"{out}/single.pkl", "wb") as f:
            pickle.dump({"tables": tables(report), "meta": report.metadata}, f)
        return
    import torch.distributed as dist

    from spectral_hooks.errors import RecordingError

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    try:
        report = record(model, inputs()).analyze(**OPTIONS, distributed=True)
        result = {"tables": tables(report), "meta": report.metadata}
        # different inputs on one rank: every rank raises (a collective check, no hang)
        other = record(model, inputs(seed=4 if rank == 1 else 3))
        try:
            other.analyze(power=True, progress=False, distributed=True)
            result["mismatch"] = "no error"
        except RecordingError as err:
            result["mismatch"] = str(err)
        with open(f"{out}/rank{rank}.pkl", "wb") as f:
            pickle.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
