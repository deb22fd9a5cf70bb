"""Ecosystem hygiene (issue #25): the four figures, measured in one run.

    python benchmarks/hygiene.py                    # this checkout (~1-2 min)
    python benchmarks/hygiene.py --root OTHER_TREE  # another checkout, e.g. the commit before

1. ``pyright`` error count on ``spectral_hooks/`` in basic mode (as ``make typecheck`` runs it);
2. ``pyright --verifytypes spectral_hooks --ignoreexternal`` type completeness, on the package
   laid out as an installed one (a symlink in a temporary site directory: verifytypes reads
   only installed packages);
3. ``import spectral_hooks`` over ``import torch, transformers, pandas, numpy`` (fresh
   subprocesses, best of ``--rounds``), and the same with every public name resolved
   (``from spectral_hooks import *``: the package face loads lazily since issue #25);
4. ``spectral-hooks --help`` (``python -m spectral_hooks.cli --help``, best of ``--rounds``).

Times: wall clock and the child's CPU time (user + system), each the best of interleaved
rounds; on a loaded machine the CPU figures are the stable ones.

Prints one JSON line and a markdown table. Needs pyright (``pip install 'pyright[nodejs]'``,
in the test extra).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASELINE = "import torch, transformers, pandas, numpy"


def _pyright() -> str:
    here = Path(sys.executable).parent / "pyright"
    found = str(here) if here.exists() else shutil.which("pyright")
    if not found:
        raise SystemExit("pyright not found: pip install 'pyright[nodejs]'")
    return found


def _json_run(cmd: list[str], cwd: Path, env: dict) -> dict:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"{cmd[0]} failed: {done.stderr[-2000:]}") from None


def pyright_errors(root: Path, env: dict) -> int:
    """Errors of ``pyright`` in basic mode on ``root/spectral_hooks``: the ``[tool.pyright]``
    section of its pyproject.toml where there is one, else a temporary pyrightconfig.json in
    ``root`` (removed afterwards) saying basic mode, so a checkout from before issue #25 is
    measured alike."""
    config = root / "pyrightconfig.json"
    has_section = "[tool.pyright]" in (root / "pyproject.toml").read_text()
    made = not has_section and not config.exists()
    if made:
        config.write_text(json.dumps({"include": ["spectral_hooks"], "pythonVersion": "3.10",
                                      "typeCheckingMode": "basic"}))
    try:
        out = _json_run([_pyright(), "--pythonpath", sys.executable, "--outputjson"], root, env)
    finally:
        if made:
            config.unlink()
    return int(out["summary"]["errorCount"])


def verifytypes(root: Path, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        site, cwd = Path(tmp) / "site", Path(tmp) / "cwd"
        site.mkdir()
        cwd.mkdir()
        (site / "spectral_hooks").symlink_to(root / "spectral_hooks")
        out = _json_run([_pyright(), "--pythonpath", sys.executable, "--outputjson",
                         "--verifytypes", "spectral_hooks", "--ignoreexternal"],
                        cwd, {**env, "PYTHONPATH": str(site)})
    t = out["typeCompleteness"]
    counts = t["exportedSymbolCounts"]
    return {"completeness": round(100 * t["completenessScore"], 1),
            "exported": sum(counts.values()), "unknown": counts["withUnknownType"],
            "ambiguous": counts["withAmbiguousType"],
            "missing_function_docstrings": t["missingFunctionDocStringCount"]}


def _best(commands: dict[str, list[str]], root: Path, env: dict, rounds: int
          ) -> tuple[dict[str, float], dict[str, float]]:
    """Best wall time and best CPU time (user + system of the child) of each command, the
    commands interleaved round by round (a shared, loaded machine drifts; interleaving keeps the
    differences fair, and CPU time does not count the waits for other processes)."""
    wall = dict.fromkeys(commands, float("inf"))
    cpu = dict.fromkeys(commands, float("inf"))
    for _ in range(rounds):
        for name, args in commands.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run([sys.executable, *args], cwd=root, env=env, check=True,
                           capture_output=True)
            wall[name] = min(wall[name], time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name] = min(cpu[name], after.ru_utime - before.ru_utime
                            + after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the checkout to measure (default: this one)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    root = args.root.resolve()
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}

    t, c = _best({"base": ["-c", BASELINE],
                  "face": ["-c", BASELINE + "; import spectral_hooks"],
                  "full": ["-c", BASELINE + "; from spectral_hooks import *"],
                  "cli": ["-m", "spectral_hooks.cli", "--help"]}, root, env, args.rounds)
    base, face, full, cli = t["base"], t["face"], t["full"], t["cli"]
    errors = pyright_errors(root, env)
    vt = verifytypes(root, env)
    row = {"root": str(root), "pyright_errors": errors, "verifytypes": vt,
           "import_overhead_s": round(face - base, 3),
           "import_overhead_all_names_s": round(full - base, 3),
           "baseline_import_s": round(base, 3), "cli_help_s": round(cli, 3),
           "cpu_s": {"import_overhead": round(c["face"] - c["base"], 3),
                     "import_overhead_all_names": round(c["full"] - c["base"], 3),
                     "baseline_import": round(c["base"], 3), "cli_help": round(c["cli"], 3)},
           "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "python": platform.python_version(), "load": os.getloadavg()[0]}
    print(json.dumps(row))
    print()
    print("| figure | value |")
    print("|---|---|")
    print(f"| pyright basic errors on spectral_hooks/ | {errors} |")
    print(f"| --verifytypes completeness | {vt['completeness']}% of {vt['exported']} exported "
          f"symbols ({vt['unknown']} unknown, {vt['ambiguous']} ambiguous; "
          f"{vt['missing_function_docstrings']} functions without a docstring) |")
    print(f"| import spectral_hooks over torch+transformers+pandas+numpy ({base:.2f} s) | "
          f"{face - base:+.2f} s wall, {c['face'] - c['base']:+.2f} s CPU (every public name "
          f"resolved: {full - base:+.2f} s wall, {c['full'] - c['base']:+.2f} s CPU) |")
    print(f"| spectral-hooks --help | {cli:.2f} s wall, {c['cli']:.2f} s CPU |")


if __name__ == "__main__":
    main()
