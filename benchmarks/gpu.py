"""A Llama-3-8B-shaped model at random init (no download): recording overhead, the power view and
all-layer top-16 Jacobian spectra, with peak memory (issue #13, goal 4).

    python benchmarks/gpu.py                                   # 32 layers, d=4096, GQA 32/8,
                                                               # 512 tokens, bf16, on CUDA
    python benchmarks/gpu.py --device cpu --layers 2 --d-model 1024   # the small CPU form
    python benchmarks/gpu.py --device cpu --layers 2 --d-model 256 --tokens 16 --vocab 500
                                                               # the suite's smoke form

Shapes follow Llama-3-8B: head dim 128 (heads = d / 128, at least 2), 4 query heads per KV
head (GQA 32/8 at d = 4096), feed-forward 3.5 d (14336 at d = 4096), RMSNorm, RoPE. Nothing in
the library is told about the device: the probe records where the model runs, the power view's
operators x -> W_O (W_V x), the block JVPs and the Krylov bases live on the model's device, in
float64 where the device has it.

Measured (one JSON line each, then a summary):
- ``record``: median over interleaved rounds of (instrumented forward / plain forward), with
  min and max, and the plain forward's time (the unit of the forward-equivalents below).
- ``power``: ``probe.analyze(power=True)`` power + spectra sections (matrix-free top-8 from
  d >= 2048, the full dense eig below), seconds and peak memory.
- ``jacobian``: ``probe.analyze(power=False, jacobian={"k": 16, "dense": False})`` jacobian
  section (every layer, top-16 of the last token's block Jacobian, plus its matrix-free metrics),
  seconds, forward-equivalents, matvecs per layer, and peak memory.
Peak memory: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` on CUDA;
the process's peak RSS (``ru_maxrss``, monotonic) on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import numpy as np
import torch


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--dtype", default=None, help="model dtype (default bfloat16 on CUDA, "
                   "float32 elsewhere)")
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5, help="interleaved recording rounds")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--skip-record", action="store_true")
    p.add_argument("--skip-power", action="store_true")
    p.add_argument("--skip-jacobian", action="store_true")
    p.add_argument("--progress", action="store_true", help="progress bars (stderr)")
    p.add_argument("--check", action="store_true", help="first compare the device's top-k "
                   "against its own exact (dense) path and against the CPU (see check())")
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    return p.parse_args(argv)


def llama_config(args):
    from transformers import LlamaConfig

    d = args.d_model
    heads = max(2, d // 128)
    kv = max(1, heads // 4)
    return LlamaConfig(hidden_size=d, intermediate_size=int(3.5 * d), num_hidden_layers=args.layers,
                       num_attention_heads=heads, num_key_value_heads=kv, head_dim=d // heads,
                       vocab_size=args.vocab, max_position_embeddings=max(8192, args.tokens),
                       rope_theta=500000.0, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0,
                       pad_token_id=0)


def build(args):
    from transformers import LlamaModel

    dtype = getattr(torch, args.dtype) if args.dtype else (
        torch.bfloat16 if args.device.startswith("cuda") else torch.float32)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(args.device):
            model = LlamaModel(llama_config(args)).eval()
    finally:
        torch.set_default_dtype(default)
    ids = torch.randint(0, args.vocab, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    return model, ids.to(args.device), dtype


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else device


def write_row(row: dict, out) -> None:
    """Print one JSON line; append it to the file ``out`` when given."""
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2 ** 30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux


def timed(device: str, fn):
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def main(argv=None) -> list[dict]:
    args = parse(argv)
    import spectral_hooks as sh

    torch.set_num_threads(args.threads)
    model, ids, dtype = build(args)
    dev = args.device
    results = []

    def emit(row: dict) -> None:
        row = {**row, "device": device_name(dev),
               "layers": args.layers, "d_model": args.d_model, "tokens": args.tokens,
               "dtype": str(dtype).replace("torch.", ""), "threads": args.threads,
               "load_avg_1min": round(os.getloadavg()[0], 2), "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        results.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")

    def forward():
        with torch.no_grad():
            return model(input_ids=ids)

    if args.check:
        emit(check(model, ids, args.k))
    t_forward = timed(dev, forward)[0]
    if not args.skip_record:
        t_forward = record_overhead(args, model, forward, emit)

    probe = sh.instrument(model)
    forward()
    if not args.skip_power:
        reset_peak(dev)
        report = probe.analyze(power=True, progress=args.progress)
        t, _ = timed(dev, lambda: (report.power, report.spectra))
        power = report.power
        emit({"measure": "power", "seconds": round(t, 3),
              "forward_equivalents": round(t / t_forward, 1),
              "matrix_free": bool(power["truncated"].all()),
              "converged": bool(power["converged"].all()), "peak_gib": round(peak_gib(dev), 3)})

    if not args.skip_jacobian:
        reset_peak(dev)
        report = probe.analyze(power=False, jacobian={"k": args.k, "dense": False},
                               progress=args.progress)
        t, table = timed(dev, lambda: report.jacobian)
        emit({"measure": "jacobian", "k": args.k, "seconds": round(t, 3),
              "seconds_per_layer": round(t / args.layers, 3),
              "forward_equivalents": round(t / t_forward, 1),
              "matvecs_per_layer": float(table["n_matvecs"].mean())
              if "n_matvecs" in table else None,
              "converged": bool(table["converged"].all()) if "converged" in table else None,
              "peak_gib": round(peak_gib(dev), 3)})
    probe.remove()
    return results


def record_overhead(args, model, forward, emit) -> float:
    """Plain and instrumented forwards interleaved, after a warm-up each; the plain median."""
    import spectral_hooks as sh

    dev = args.device
    probe = sh.instrument(model)
    forward()
    probe.remove()
    forward()
    plain, hooked = [], []
    for _ in range(args.rounds):
        plain.append(timed(dev, forward)[0])
        probe = sh.instrument(model)
        hooked.append(timed(dev, forward)[0])
        probe.remove()
        del probe
    ratios = [h / p for h, p in zip(hooked, plain)]
    t_forward = statistics.median(plain)
    emit({"measure": "record", "median_ratio": round(statistics.median(ratios), 4),
          "min": round(min(ratios), 4), "max": round(max(ratios), 4),
          "forward_s": round(t_forward, 4), "rounds": args.rounds})
    return t_forward


SOURCES = ("F", "jacobian")  # the spectra section's sources: the power view's F, block Jacobians


def _eigenvalues(report, source: str) -> dict:
    """{layer: complex eigenvalues} of a report's spectra section, largest modulus first."""
    table = report.spectra
    table = table[table["source"] == source]
    out = {}
    for layer, rows in table.groupby("layer"):
        values = rows["real"].to_numpy() + 1j * rows["imag"].to_numpy()
        out[int(layer)] = values[np.argsort(-np.abs(values), kind="stable")]
    return out


def _distance(found: dict, reference: dict, k: int) -> float:
    """Largest distance, over layers and the top k found, from a found eigenvalue to the
    nearest reference eigenvalue, relative to the layer's largest modulus (0: every one found
    is an eigenvalue of the reference), and the largest relative gap between the k-th moduli."""
    if not found or set(found) != set(reference):
        raise ValueError(f"layers {sorted(found)} found, {sorted(reference)} in the reference")
    worst = 0.0
    for layer, values in found.items():
        ref = reference[layer]
        scale = abs(ref[0])
        near = np.abs(values[:k, None] - ref[None, :]).min(axis=1).max() / scale
        kth = abs(abs(values[k - 1]) - abs(ref[k - 1])) / scale
        worst = max(worst, float(near), float(kth))
    return worst


def _spectra(model, ids, k: int, free: bool):
    """The power and jacobian spectra of one forward, exact (dense, full eig) or matrix-free."""
    import spectral_hooks as sh

    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=ids)
        options = ({"power": {"full": False, "k": k}, "jacobian": {"k": k, "dense": False}}
                   if free else {"power": {"full": True}, "jacobian": {"k": k, "dense": True}})
        report = probe.analyze(**options, progress=False)
        converged = bool(report.jacobian["converged"].all() and report.power["converged"].all())
        return {s: _eigenvalues(report, s) for s in SOURCES}, converged


def check(model, ids, k: int) -> dict:
    """Numbers on the device against oracles: its matrix-free top-k (``eigs``) against its own
    exact path (the full float64 eig of the dense block Jacobian and of F = W_O W_V, formed on
    the device), and the device's exact spectra against the same model's on the CPU (the
    recorded states differ there by the model dtype's rounding: a float32 figure there, not
    the solver's)."""
    import copy

    exact, _ = _spectra(model, ids, k, free=False)
    free, converged = _spectra(model, ids, k, free=True)
    cpu, _ = _spectra(copy.deepcopy(model).to("cpu"), ids.cpu(), k, free=False)
    row = {"measure": "check", "k": k, "converged": converged}
    for source in SOURCES:
        row[f"{source}_free_vs_exact"] = _distance(free[source], exact[source], k)
        row[f"{source}_device_vs_cpu"] = _distance(exact[source], cpu[source], k)
    return row


if __name__ == "__main__":
    main()
