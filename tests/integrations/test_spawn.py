"""The harness that runs distributed workers: a failed rank ends the run at once with its log,
a hang is reported with every rank's Python stack, a port taken before the rendezvous binds it
is retried on a fresh one."""

import textwrap
import time

import pytest

from . import spawn


def _worker(tmp_path, body: str):
    path = tmp_path / "worker.py"
    path.write_text("import sys, time\nrank = int(sys.argv[1])\n" + textwrap.dedent(body))
    return path


def test_a_failed_rank_ends_the_run_at_once_with_its_log(tmp_path):
    worker = _worker(tmp_path, """
        if rank == 1:
            raise SystemExit("rank 1 gives up")
        time.sleep(60)  # rank 0 would wait for rank 1 in a collective
    """)
    start = time.monotonic()
    with pytest.raises(AssertionError, match="(?s)rank 1 of 2 failed:.*rank 1 gives up"):
        spawn.run_ranks(worker, 2, timeout=50)
    assert time.monotonic() - start < 30


def test_a_hang_is_reported_with_every_ranks_stack(tmp_path):
    worker = _worker(tmp_path, """
        def wait_for_the_others():
            time.sleep(60)
        wait_for_the_others()
    """)
    with pytest.raises(pytest.fail.Exception, match="(?s)hung.*rank 1.*wait_for_the_others"):
        spawn.run_ranks(worker, 2, timeout=3)


def test_a_port_taken_before_the_rendezvous_is_retried_once(tmp_path):
    marker = tmp_path / "tried"
    worker = _worker(tmp_path, f"""
        import pathlib
        marker = pathlib.Path({str(marker)!r})
        if rank == 0 and not marker.exists():
            marker.write_text("once")
            raise SystemExit("RuntimeError: Address already in use")
        print("rank", rank, "ok")
    """)
    logs = spawn.run_ranks(worker, 2, timeout=30)
    assert [log.strip() for log in logs] == ["rank 0 ok", "rank 1 ok"]
