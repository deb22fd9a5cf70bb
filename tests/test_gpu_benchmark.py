"""benchmarks/gpu.py runs unchanged on the CPU in a small form (the Llama-3-8B shape scaled
down: GQA, RMSNorm, RoPE, random init, no download); its measures come out well formed."""

import importlib.util
import math
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_benchmark_small_cpu_form(tmp_path):
    bench = _load()
    threads = torch.get_num_threads()
    try:
        rows = bench.main(["--device", "cpu", "--layers", "2", "--d-model", "128", "--tokens",
                           "8", "--vocab", "100", "--k", "4", "--rounds", "1",
                           "--out", str(tmp_path / "gpu.jsonl")])
    finally:
        torch.set_num_threads(threads)
    by = {row["measure"]: row for row in rows}
    assert set(by) == {"record", "power", "jacobian"}
    assert math.isfinite(by["record"]["median_ratio"]) and by["record"]["forward_s"] > 0
    assert by["power"]["converged"] and not by["power"]["matrix_free"]  # d < 2048: dense
    assert by["jacobian"]["converged"] and by["jacobian"]["matvecs_per_layer"] > 0
    assert all(row["peak_gib"] > 0 for row in rows if "peak_gib" in row)
    assert len((tmp_path / "gpu.jsonl").read_text().splitlines()) == 3
    config = bench.llama_config(bench.parse(["--d-model", "4096", "--layers", "32"]))
    assert (config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size, config.head_dim) == (32, 8, 14336, 128)


def test_jacobian_parts_small_cpu_form(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_parts", SCRIPT.parent / "jacobian_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    try:
        rows = module.main(["--device", "cpu", "--d-model", "128", "--tokens", "8", "--layers",
                            "1", "--k", "4", "--materialize",
                            "--out", str(tmp_path / "parts.jsonl")])
    finally:
        torch.set_num_threads(threads)
    by = {row["part"]: row for row in rows}
    assert list(by) == ["eigs", "eigs(materialize=True)", "svds(J)", "svds(J-I)", "hutchinson"]
    # 128 columns in one 128-column product, then one product checking the returned pairs
    assert by["eigs(materialize=True)"]["sequential_forward"] == 2
    assert by["eigs(materialize=True)"]["columns"] > 128
    assert by["eigs"]["sequential_adjoint"] == 0 and by["eigs"]["columns"] >= 4
    for part in ("svds(J)", "svds(J-I)"):  # Golub-Kahan: one J and one J^T per step
        assert by[part]["sequential_forward"] == by[part]["sequential_adjoint"] > 0
    assert by["hutchinson"]["columns"] == 4 * 64  # J Z, J^T Z, then J^T Y and J W
    assert len((tmp_path / "parts.jsonl").read_text().splitlines()) == 5
