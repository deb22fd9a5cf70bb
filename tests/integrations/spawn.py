"""Run a worker script as the ranks of a real multi-process torch.distributed group (gloo)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker: str | Path, world: int, *args: object, timeout: float = 120.0,
              pass_port: bool = False, env: Optional[dict] = None) -> list[str]:
    """Start ``python worker RANK WORLD [PORT] *args`` for every rank (MASTER_ADDR/PORT in the
    environment too), wait for all, kill only the processes started here if they hang, and
    fail with the log of any rank that exited non-zero. Returns every rank's output."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    procs = [subprocess.Popen([sys.executable, str(worker), str(rank), str(world),
                               *([str(port)] if pass_port else []), *map(str, args)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in range(world)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"{Path(worker).name}: distributed workers hung ({timeout:.0f} s)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} of {world} failed:\n{log[-3000:]}"
    return logs
