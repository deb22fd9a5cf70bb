"""Where the jacobian section's time goes, part by part, on the model's own operator.

The section computes, per block Jacobian J (matrix-free): ``eigs(J, k)``, ``svds(J, k)``,
``svds(J - I, k)`` and the Hutchinson probes (``metrics/jacobian.py: _matrix_free``). This
script times each part on a Llama-shaped block at random init (same shapes as
``benchmarks/gpu.py``) and counts, per part, the column applications (``n_matvecs``) and the
sequential applications of J and of J^T (calls of the operator's matmat / rmatmat: on an
accelerator each one costs about the same whatever its width, so their number sets the time),
and with ``--profile`` the host syncs and the heaviest ops of one layer (``torch.profiler``).

    python benchmarks/jacobian_parts.py                         # CUDA if present: Llama-3-8B
    python benchmarks/jacobian_parts.py --device cpu --d-model 1024 --tokens 128 --layers 1

One JSON line per (layer, part), then, with ``--profile``, a table of the top ops.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _gpu_module():
    spec = importlib.util.spec_from_file_location("bench_gpu", HERE / "gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--d-model", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--layers", type=int, default=2, help="layers built and measured")
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--dtype", default=None)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="profile the last layer's parts")
    p.add_argument("--materialize", action="store_true",
                   help="also time eigs(J, k, materialize=True): the operator's matrix, n "
                        "columns in 128-column products, then the iteration on it (issue 24: "
                        "the CPU default where that is cheaper; on an accelerator unmeasured)")
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    return p.parse_args(argv)


class Counted:
    """Counts the sequential applications of an operator's matmat and rmatmat."""

    def __init__(self, op):
        self.op, self.calls = op, {"forward": 0, "adjoint": 0}
        matmat, rmatmat = op.matmat, op.rmatmat

        def counted_matmat(X):
            self.calls["forward"] += 1
            return matmat(X)

        def counted_rmatmat(X):
            self.calls["adjoint"] += 1
            return rmatmat(X)

        op.matmat, op.rmatmat = counted_matmat, counted_rmatmat


def parts(op, k: int, materialize: bool = False):
    """The section's parts on one operator, in its order (metrics/jacobian.py); with
    ``materialize``, eigs on the materialised operator right after eigs as the section runs
    it."""
    from spectral_hooks.linalg import IdentityOperator, eigs, svds
    from spectral_hooks.metrics import jacobian as metrics

    delta = op - IdentityOperator(op.shape[0], dtype=op.dtype, device=op.device)
    found = {}
    yield "eigs", lambda: found.update(values=eigs(op, k, tol=1e-8, seed=0,
                                                   return_vectors=False).values)
    if materialize:
        yield "eigs(materialize=True)", lambda: found.update(materialised=eigs(
            op, k, tol=1e-8, seed=0, return_vectors=False, materialize=True).values)
    yield "svds(J)", lambda: svds(op, k, tol=1e-8, seed=2, return_vectors=False)
    yield "svds(J-I)", lambda: svds(delta, k, tol=1e-8, seed=3)
    yield "hutchinson", lambda: metrics._hutchinson(op, 64, 4, found["values"][:k])


def main(argv=None) -> list[dict]:
    args = parse(argv)
    gpu = _gpu_module()
    torch.set_num_threads(args.threads)
    build_args = gpu.parse(["--device", args.device, "--layers", str(args.layers), "--d-model",
                            str(args.d_model), "--tokens", str(args.tokens), "--vocab",
                            str(args.vocab)] + (["--dtype", args.dtype] if args.dtype else []))
    model, ids, dtype = gpu.build(build_args)
    dev = args.device
    import spectral_hooks as sh

    probe = sh.instrument(model)
    with torch.no_grad():
        model(input_ids=ids)
    rows = []
    for layer in range(args.layers):
        t_build, op = gpu.timed(dev, lambda layer=layer: probe.jacobian(layer))
        counted = Counted(op)
        op._need_adjoint()
        for name, run in parts(op, args.k, args.materialize):
            before, n0 = dict(counted.calls), op.n_matvecs
            seconds, _ = gpu.timed(dev, run)
            row = {"layer": layer, "part": name, "seconds": round(seconds, 4),
                   "columns": op.n_matvecs - n0,
                   "sequential_forward": counted.calls["forward"] - before["forward"],
                   "sequential_adjoint": counted.calls["adjoint"] - before["adjoint"],
                   "operator_build_s": round(t_build, 4), "d_model": args.d_model,
                   "tokens": args.tokens, "dtype": str(dtype).replace("torch.", ""),
                   "device": gpu.device_name(dev), "torch": torch.__version__,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
            rows.append(row)
            gpu.write_row(row, args.out)
    if args.profile:
        profile_layer(probe, args.layers - 1, args.k, dev)
    probe.remove()
    return rows


def profile_layer(probe, layer: int, k: int, dev: str) -> None:
    """Each part of one layer under torch.profiler: host syncs and the top ops by self time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.startswith("cuda")
                                           else [])
    op = probe.jacobian(layer)
    op._need_adjoint()
    for name, run in parts(op, k):
        with profile(activities=activities) as prof:
            run()
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
        events = prof.key_averages()
        syncs = sum(e.count for e in events if e.key in ("aten::_local_scalar_dense",
                                                          "cudaStreamSynchronize"))
        launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel",
                                                             "cuLaunchKernel",
                                                             "cudaLaunchKernelExC"))
        print(f"## {name}: host syncs {syncs}, kernel launches {launches}", flush=True)
        sort = "self_cuda_time_total" if dev.startswith("cuda") else "self_cpu_time_total"
        print(events.table(sort_by=sort, row_limit=12, max_name_column_width=40), flush=True)


if __name__ == "__main__":
    main()
