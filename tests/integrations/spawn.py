"""Run a worker script as the ranks of a real multi-process torch.distributed group (gloo)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: how a rank says its rendezvous port was taken between free_port() and its bind (another
#: process, e.g. a gloo pair of a test beside this one, got the released port first)
PORT_TAKEN = ("Address already in use", "EADDRINUSE")


def run_ranks(worker: str | Path, world: int, *args: object, timeout: float = 120.0,
              pass_port: bool = False, env: Optional[dict] = None) -> list[str]:
    """Start ``python worker RANK WORLD [PORT] *args`` for every rank (MASTER_ADDR/PORT in the
    environment too), wait for all, kill only the processes started here if they hang, and
    fail with the log of any rank that exited non-zero. Returns every rank's output.

    A rank that fails ends the run at once (the others, left waiting for it in a collective,
    are killed), and one whose port was taken (PORT_TAKEN) is retried once on a fresh port. On
    a hang every rank's Python stack is dumped (faulthandler, SIGABRT) into the failure."""
    for attempt in range(2):
        failed, logs = _run_once(worker, world, args, timeout, pass_port, env)
        if failed is None:
            return logs
        if not (attempt == 0 and any(m in logs[failed] for m in PORT_TAKEN)):
            break
    if failed == -1:
        pytest.fail(f"{Path(worker).name}: distributed workers hung ({timeout:.0f} s); their "
                    "stacks:\n" + "\n".join(f"--- rank {r}:\n{log[-3000:]}"
                                            for r, log in enumerate(logs)))
    raise AssertionError(f"rank {failed} of {world} failed:\n{logs[failed][-3000:]}")


def _run_once(worker, world: int, args: tuple, timeout: float, pass_port: bool,
              env: Optional[dict]) -> tuple[Optional[int], list[str]]:
    """One launch of every rank: (None, logs) if all exited 0, (rank, logs) for the first
    that failed, (-1, logs) on a hang. Output goes to files (a full pipe would block a rank)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "PYTHONFAULTHANDLER": "1", **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        files = [open(Path(tmp) / f"rank{rank}.log", "w+") for rank in range(world)]
        procs = [subprocess.Popen([sys.executable, str(worker), str(rank), str(world),
                                   *([str(port)] if pass_port else []), *map(str, args)],
                                  env=env, stdout=files[rank], stderr=subprocess.STDOUT,
                                  text=True) for rank in range(world)]
        failed: Optional[int] = None
        deadline = time.monotonic() + timeout
        try:
            while any(proc.poll() is None for proc in procs):
                bad = [r for r, proc in enumerate(procs) if proc.poll() not in (None, 0)]
                if bad:
                    failed = bad[0]
                    break
                if time.monotonic() > deadline:
                    failed = -1
                    for proc in procs:
                        if proc.poll() is None:
                            proc.send_signal(signal.SIGABRT)  # faulthandler dumps the stacks
                    for proc in procs:
                        try:
                            proc.wait(timeout=10)
                        except subprocess.TimeoutExpired:
                            pass
                    break
                time.sleep(0.1)
            else:
                bad = [r for r, proc in enumerate(procs) if proc.returncode != 0]
                failed = bad[0] if bad else None
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        logs = []
        for f in files:
            f.seek(0)
            logs.append(f.read())
            f.close()
    return failed, logs
