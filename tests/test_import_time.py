"""Import and CLI start-up stay fast (issue #25): ``import spectral_hooks`` loads no heavy
module (torch, transformers' modeling code, DTensor/FSDP, sympy, plotting, topology,
integrations) until a name is used, and ``spectral-hooks --help`` prints before torch is
imported. Timed in fresh subprocesses against a baseline subprocess that imports torch,
transformers, pandas and numpy, by the CPU time the child used (user + system: wall time on a
loaded 2-core machine measures the other processes), best of interleaved rounds, with generous
margins; the wall-clock figures: benchmarks/hygiene.py."""

import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "import torch, transformers, pandas, numpy"
HEAVY = ["torch", "transformers.modeling_utils", "torch.distributed.tensor", "sympy",
         "matplotlib", "networkx", "igraph", "lightning", "peft", "spectral_hooks.integrations",
         "spectral_hooks.report.plots"]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _cpu_s(args: list) -> float:
    """CPU seconds (user + system) a fresh interpreter running ``args`` used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *args], check=True, capture_output=True, env=_env(), cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _best_of(commands: dict, rounds: int = 3) -> dict:
    best = dict.fromkeys(commands, float("inf"))
    for _ in range(rounds):  # interleaved: drift hits every command alike
        for name, args in commands.items():
            best[name] = min(best[name], _cpu_s(args))
    return best


def test_import_loads_nothing_heavy():
    code = ("import sys, spectral_hooks as sh; sh.__version__; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, env=_env(), cwd=ROOT)
    assert done.stdout.strip() == "[]"


def test_public_names_resolve_lazily():
    code = ("import spectral_hooks as sh; from spectral_hooks import *; "
            "missing = [n for n in sh.__all__ if getattr(sh, n, None) is None]; "
            "assert not missing, missing; assert sh.linalg.eigs is sh.eigs; "
            "assert set(sh.__all__) <= set(dir(sh)); print('OK')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-2000:]


def test_import_overhead_and_cli_help_are_fast():
    t = _best_of({"base": ["-c", BASELINE],
                  # the modules instrument() and analyze() need, not only the lazy face
                  "package": ["-c", BASELINE + "; import spectral_hooks.probe, spectral_hooks.report"],
                  "help": ["-m", "spectral_hooks.cli", "--help"]})
    # targets 0.5 s and 1.0 s (measured ~0.2 s and ~0.1 s); margins for a loaded machine
    assert t["package"] - t["base"] < 1.5, t
    assert t["help"] < 3.0, t


def test_cli_help_before_torch():
    code = ("import sys; from spectral_hooks.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), cwd=ROOT)
    assert "usage: spectral-hooks" in done.stdout
    assert done.stderr.strip().endswith("False"), done.stderr[-2000:]
