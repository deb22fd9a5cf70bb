"""Layers across processes: 2 ranks x 1 thread vs 1 rank x 1 thread, same recording (issue #13,
goal 5).

    python benchmarks/distributed.py                     # 12 layers, d=384, 64 tokens, 3 rounds
    python benchmarks/distributed.py --quick             # 12 layers, d=128, 32 tokens, 2 rounds

Each round starts a 1-rank run and a 2-rank gloo run (alternating which goes first), each rank
with one torch thread. Every process builds the same GPT-2-shaped model at random init (seed 0),
records the same batch, warms up (one analysis of layer 0 on a probe of its own: the one-off
lazy imports and first JVP trace, ~2.5 CPU-s a process; ``--cold`` skips it), waits at a
barrier, then times ``probe.analyze(power=True,
jacobian={"k": 16}, distributed=...)`` with every section read, up to a second barrier: the
wall time of the analysis on the slowest rank (process start, imports and recording excluded,
they are printed apart). The 1-rank run is a plain ``probe.analyze`` (no process group). The
2-rank tables are checked equal to the 1-rank ones. Prints one JSON line per round and a
summary: median ratio (2 ranks / 1 rank) with min and max, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build(args):
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    model = GPT2Model(GPT2Config(n_layer=args.layers, n_embd=args.d_model,
                                 n_head=max(1, args.d_model // 64), vocab_size=1000,
                                 n_positions=max(64, args.tokens), bos_token_id=0,
                                 eos_token_id=0)).eval()
    ids = torch.randint(0, 1000, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    return model, ids


def worker(rank: int, world: int, port: int, out: str, args) -> None:
    started = time.perf_counter()
    import torch

    import spectral_hooks as sh

    torch.set_num_threads(1)
    dist = None
    if world > 1:
        from datetime import timedelta

        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=1200))
    model, ids = build(args)
    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=ids)
    if not args.cold:  # pay the one-off costs (lazy imports, first JVP trace: ~2.5 CPU-s)
        warm = sh.instrument(model, layers=[0])  # on its own probe: nothing cached for later
        with torch.no_grad():
            model(input_ids=ids)
        warm.remove()
        report = warm.analyze(power=True, jacobian={"k": args.k}, progress=False)
        _ = [report[name] for name in report.sections]
    setup = time.perf_counter() - started
    if dist is not None:
        dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    report = probe.analyze(power=True, jacobian={"k": args.k}, progress=False,
                           distributed=world > 1)
    tables = {name: report[name] for name in report.sections}
    if dist is not None:
        dist.barrier()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    with open(f"{out}/world{world}.rank{rank}.cpu", "w") as f:
        f.write(str(cpu))
    if dist is not None:
        dist.barrier()
    if rank == 0:
        cpus = [float(Path(f"{out}/world{world}.rank{r}.cpu").read_text()) for r in range(world)]
        with open(f"{out}/world{world}.pkl", "wb") as f:
            pickle.dump({"elapsed": elapsed, "setup": setup, "tables": tables, "cpu": cpus,
                         "meta": report.metadata}, f)
    if dist is not None:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, out: str, argv: list[str]) -> dict:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(world),
                               str(port), out, *argv], env=env) for r in range(world)]
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"a rank of the {world}-rank run failed")
    with open(f"{out}/world{world}.pkl", "rb") as f:
        return pickle.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="d=128, 32 tokens, 2 rounds")
    parser.add_argument("--cold", action="store_true",
                        help="no warm-up: time each process's first analysis")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.d_model, args.tokens, args.rounds = 128, 32, 2
    if args.worker:
        rank, world, port, out = args.worker
        worker(int(rank), int(world), int(port), out, args)
        return
    import pandas as pd

    argv = ["--layers", str(args.layers), "--d-model", str(args.d_model),
            "--tokens", str(args.tokens), "--k", str(args.k)] + (["--cold"] if args.cold else [])
    ratios = []
    with tempfile.TemporaryDirectory() as out:
        for i in range(args.rounds):
            order = (1, 2) if i % 2 == 0 else (2, 1)
            load = os.getloadavg()[0]
            runs = {world: launch(world, out, argv) for world in order}
            for name, table in runs[1]["tables"].items():
                pd.testing.assert_frame_equal(runs[2]["tables"][name], table, obj=name)
            ratio = runs[2]["elapsed"] / runs[1]["elapsed"]
            ratios.append(ratio)
            print(json.dumps({"round": i, "order": order, "one_rank_s": round(runs[1]["elapsed"], 2),
                              "two_ranks_s": round(runs[2]["elapsed"], 2), "ratio": round(ratio, 3),
                              "cpu_s_per_rank": {w: [round(c, 2) for c in runs[w]["cpu"]]
                                                 for w in (1, 2)},
                              "setup_s": [round(runs[w]["setup"], 1) for w in (1, 2)],
                              "load_avg_1min_before": round(load, 2),
                              "load_avg_1min_after": round(os.getloadavg()[0], 2)}), flush=True)
    import torch
    print(json.dumps({"summary": "2 ranks x 1 thread / 1 rank x 1 thread (analysis wall time)",
                      "warm": not args.cold,
                      "layers": args.layers, "d_model": args.d_model, "tokens": args.tokens,
                      "k": args.k, "median_ratio": round(statistics.median(ratios), 3),
                      "min": round(min(ratios), 3), "max": round(max(ratios), 3),
                      "cpus": os.cpu_count(), "torch": torch.__version__,
                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))


if __name__ == "__main__":
    main()
