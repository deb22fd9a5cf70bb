"""The power view of grouped-query models above the matrix-free width: exact from factors vs top-k.

    python benchmarks/power_factored.py            # ~6 min, one thread
    python benchmarks/power_factored.py --quick    # the Llama-3.2-1B shape only, no dense eig
    python benchmarks/power_factored.py --dense-8b # also the dense eig at d = 3584 / 4096 (~3 min more)

Models: Llama-shaped ``LlamaModel``s, random init (HF's, std 0.02), 2 layers, attention as in
Qwen2.5-1.5B (d = 1536, 12 heads of 128, 2 key/value heads: r = 256), Llama-3.2-1B (d = 2048,
32 heads of 64, 8 key/value heads: r = 512) and Llama-3-8B (d = 4096, 32 heads of 128, 8
key/value heads: r = 1024), and Gemma-2-9B's widths (d = 3584, 16 heads of 256, 8 key/value
heads: r = 2048);
a small MLP (the power view reads only W_O, W_V). One forward of 16
tokens, then the ``power`` and ``spectra`` sections of ``probe.analyze`` (CPU, one thread),
timed per variant from a cleared spectrum cache:

* exact from factors (the default up to r = 384 since issue 57, and for every r here with
  ``metrics.spectrum.FACTORED_EXACT_MAX`` raised to 2048, as this benchmark runs it): F = W_O W_V
  is never formed and every eigenvalue comes exactly from the r x r matrix W_V W_O;
* ``power={"full": False}``: the top 8 eigenpairs by ``linalg.eigs`` (on the r x r W_V W_O
  since issue 57, on the thin products before; the default for r > 384 at d >= 1024;
  ``truncated=True``);
* ``power={"full": True}``: the dense float64 eig of each d x d F (the oracle, and the default
  before at d < 2048).

Checked in the same run: the default's spectra against the dense oracle's (every eigenvalue,
matched in order) and the top-k path's leading values against the default's.

Steering (``sh.steer(model, u, layer=-1)``, gap 0.1, a random direction): the search for alpha
runs on the (r + 1) x (r + 1) matrix of the merged factors, against the dense path it replaces
(every step a d x d ``eigvals`` and LU; forced here by swapping ``steering_math._layer_map`` for
the dense one); the same alpha and after-edit figures are checked. The dense path beyond
d = 2048 (10-15 min) is not run.
Writes benchmarks/results/power_factored.md.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_v] = "1"  # before numpy/torch load their BLAS

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "power_factored.md"
LAYER_MAP = None
SHAPES = {"Qwen2.5-1.5B": dict(hidden_size=1536, num_attention_heads=12, head_dim=128,
                               num_key_value_heads=2),
          "Llama-3.2-1B": dict(hidden_size=2048, num_attention_heads=32, head_dim=64,
                               num_key_value_heads=8),
          "Llama-3-8B": dict(hidden_size=4096, num_attention_heads=32, head_dim=128,
                             num_key_value_heads=8),
          "Gemma-2-9B": dict(hidden_size=3584, num_attention_heads=16, head_dim=256,
                             num_key_value_heads=8)}


def build(shape: str):
    from transformers import LlamaConfig, LlamaModel

    import spectral_hooks as sh
    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPES[shape], intermediate_size=256,
                      num_hidden_layers=2, vocab_size=1000, max_position_embeddings=256,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = LlamaModel(cfg).eval()
    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1)))
    return probe


def timed(probe, power) -> tuple[float, object]:
    from spectral_hooks.metrics.spectrum import clear_spectrum_cache
    clear_spectrum_cache()
    result = probe.analyze(power=power, progress=False)  # lazy: only the sections read run
    t0 = time.perf_counter()
    tables = (result.power, result.spectra)
    return time.perf_counter() - t0, tables


def values(spectra, layer: int) -> np.ndarray:
    rows = spectra[(spectra["layer"] == layer) & (spectra["source"] == "F")]
    return rows["real"].to_numpy() + 1j * rows["imag"].to_numpy()


def run(shape: str, dense: bool) -> list[str]:
    probe = build(shape)
    anatomy = probe.anatomy
    d = anatomy.d_model
    r = SHAPES[shape]["num_key_value_heads"] * SHAPES[shape]["head_dim"]
    t_exact, (power, spectra) = timed(probe, True)
    t_topk, (power_k, spectra_k) = timed(probe, {"full": False, "k": 8})
    lines = [f"### {shape}: d = {d}, r = {r}, 2 layers", "",
             "| variant | s / layer | eigenvalues a layer | truncated | converged |",
             "|---|---|---|---|---|",
             f"| exact from factors (FACTORED_EXACT_MAX = 2048) | **{t_exact / 2:.2f}** | {len(values(spectra, 0))} "
             f"| {bool(power['truncated'].any())} | {bool(power['converged'].all())} |",
             f"| `full=False` (top 8, `eigs`) | {t_topk / 2:.2f} | {len(values(spectra_k, 0))} "
             f"| {bool(power_k['truncated'].all())} | {bool(power_k['converged'].all())} |"]
    top_err = max(float(np.abs(values(spectra_k, t)[:8] - values(spectra, t)[:8]).max()
                        / np.abs(values(spectra, t)[0])) for t in (0, 1))
    notes = [f"- top-8 of `eigs` vs the default's leading 8: max difference {top_err:.1e} "
             "(relative to |lambda_1|)"]
    if dense:
        t_dense, (power_d, spectra_d) = timed(probe, {"full": True})
        lines.append(f"| `full=True` (dense eig of F) | {t_dense / 2:.2f} | "
                     f"{len(values(spectra_d, 0))} | {bool(power_d['truncated'].any())} | "
                     f"{bool(power_d['converged'].all())} |")
        err = max(float(np.abs(values(spectra_d, t) - values(spectra, t)).max()
                        / np.abs(values(spectra_d, t)[0])) for t in (0, 1))
        cols = ["abs_lambda1", "abs_lambda2", "gap_ratio", "gamma", "rho"]
        col_err = float(np.abs(power[cols].to_numpy(float) - power_d[cols].to_numpy(float)).max())
        notes.append(f"- default vs dense oracle: every eigenvalue within {err:.1e} of "
                     f"|lambda_1|; power columns {cols} within {col_err:.1e}")
        notes.append(f"- the dense eig takes **{t_dense / t_exact:.0f}x** the default's time, "
                     f"top-8 `eigs` {t_topk / t_exact:.1f}x")
    else:
        notes.append(f"- top-8 `eigs` takes {t_topk / t_exact:.1f}x the default's time")
    notes += steering(probe, dense and d <= 2048)  # the dense search beyond: 10-15 min
    probe.remove()
    return lines + [""] + notes + [""]


def steering(probe, dense: bool) -> list[str]:
    import spectral_hooks as sh
    from spectral_hooks.metrics import steering_math
    u = torch.randn(probe.anatomy.d_model, generator=torch.Generator().manual_seed(2))
    runs = {}
    for path in ("factored", "dense") if dense else ("factored",):
        if path == "dense":
            steering_math._layer_map = lambda V, O, H, u: (
                steering_math._Map(O @ V), torch.linalg.pinv(V.T) @ u)
        t0 = time.perf_counter()
        edit = sh.steer(probe.model, u, layer=-1, gap=0.1)
        runs[path] = (time.perf_counter() - t0, edit)
        edit.remove()
    steering_math._layer_map = LAYER_MAP
    t, e = runs["factored"]
    line = (f"- `sh.steer(model, u, gap=0.1)`: **{t:.1f} s** (alpha {e.alpha:.6g}, gap after "
            f"{e.gap_after:.4f}, |cos(v1, u)| {e.eigvec_cos_after:.4f}, residual gap "
            f"{e.residual_gap_after:.4f})")
    if "dense" in runs:
        td, ed = runs["dense"]
        same = max(abs(e.alpha - ed.alpha) / ed.alpha, abs(e.gap_after - ed.gap_after),
                   abs(e.eigvec_cos_after - ed.eigvec_cos_after))
        line += (f"; the dense path {td:.1f} s (**{td / t:.0f}x**), the same edit within "
                 f"{same:.1e}")
    return [line]


def main() -> None:
    global LAYER_MAP
    from spectral_hooks.metrics import steering_math
    LAYER_MAP = steering_math._layer_map
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dense-8b", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import spectral_hooks  # noqa: F401  (imported before timing)
    from spectral_hooks.metrics import spectrum
    spectrum.FACTORED_EXACT_MAX = 2048  # the subject here: every eigenvalue from the factors
    out = ["# Power view of grouped-query models: exact from factors vs top-k (one thread)", "",
           f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
           "written by `benchmarks/power_factored.py`", ""]
    out += run("Llama-3.2-1B", dense=not args.quick)
    if not args.quick:
        out += run("Qwen2.5-1.5B", dense=True)
        out += run("Llama-3-8B", dense=args.dense_8b)
        out += run("Gemma-2-9B", dense=args.dense_8b)
    text = "\n".join(out)
    print(text)
    if not args.quick:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
