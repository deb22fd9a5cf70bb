"""CSV and JSONL loggers survive SIGKILL mid-write: every file reads with pandas after each kill,
and ``append=True`` resumes cleanly (issue 16: CSVLogger left a torn row that the next append
glued onto, and ``pandas.read_csv`` failed)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spectral_hooks.integrations.loggers import CSVLogger, JSONLLogger, TornLineWarning

LOGGERS = Path(__file__).resolve().parents[2] / "spectral_hooks" / "integrations" / "loggers.py"

# The child loads loggers.py alone (stdlib only: no torch import, so a kill lands mid-logging
# within milliseconds) and logs 40-metric events forever, resuming after the last step written.
CHILD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("loggers", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
csv_log = mod.CSVLogger(sys.argv[2], append=True)
jsonl_log = mod.JSONLLogger(sys.argv[3], append=True)
step = int(sys.argv[4])
print("ready", flush=True)
while True:
    metrics = {f"spectral/layer_{i:02d}/gap_ratio": step + i / 64 for i in range(40)}
    csv_log.log(metrics, step)
    jsonl_log.log(metrics, step)
    step += 1
"""


def _whole_lines(path: Path) -> io.BytesIO:
    """The file without a torn last line. Linux may cut a write() at a page boundary when a
    fatal signal (SIGKILL) is pending, so a kill can leave at most that one torn line, which
    ``append=True`` truncates on the next open; every line before it is whole."""
    data = path.read_bytes()
    return io.BytesIO(data[:data.rfind(b"\n") + 1])


def _check_files(csv_path: Path, jsonl_path: Path) -> int:
    """Both files read with pandas; every whole row is a whole record; the last complete step."""
    pd.read_csv(csv_path)  # the raw file, torn tail included, reads
    table = pd.read_csv(_whole_lines(csv_path))
    assert list(table.columns) == ["step", "name", "value"]
    assert table["value"].dtype == np.float64 and table["step"].dtype == np.int64
    assert table["name"].str.fullmatch(r"spectral/layer_\d\d/gap_ratio").all()
    index = table["name"].str.slice(15, 17).astype(int)
    np.testing.assert_array_equal(table["value"].to_numpy(), table["step"] + index / 64)
    records = pd.read_json(_whole_lines(jsonl_path), lines=True)
    if len(records):
        assert records.shape[1] == 41 and records.notna().all().all()
        assert (records["step"].diff().dropna() == 1).all()  # no step lost, none repeated
    return int(records["step"].max()) + 1 if len(records) else 0


def test_sigkill_mid_write_20_times(tmp_path):
    csv_path, jsonl_path = tmp_path / "m.csv", tmp_path / "m.jsonl"
    rng = np.random.default_rng(16)
    step = 0
    for _ in range(20):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(LOGGERS), str(csv_path),
                                  str(jsonl_path), str(step)], stdout=subprocess.PIPE)
        assert child.stdout.readline() == b"ready\n"
        time.sleep(float(rng.uniform(0.005, 0.08)))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TornLineWarning)
            step = _check_files(csv_path, jsonl_path)
    assert step > 20  # the children did log between kills
    csv_steps = pd.read_csv(csv_path)["step"].unique()
    assert set(csv_steps) >= set(range(step))  # every JSONL step also reached the CSV


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_append_truncates_a_torn_last_line(tmp_path, kind):
    path = tmp_path / f"m.{kind}"
    cls = CSVLogger if kind == "csv" else JSONLLogger
    with cls(path) as logger:
        logger.log({"a": 1.0, "b": 2.0}, 1)
    whole = path.read_bytes()
    torn = b"2,a,0.12" if kind == "csv" else b'{"step": 2, "a": 0.1'
    path.write_bytes(whole + torn)  # what a killed writer of the old logger left
    with pytest.warns(TornLineWarning, match=f"truncated {len(torn)} bytes"):
        logger = cls(path, append=True)
    with logger:
        logger.log({"a": 3.0}, 3)
    assert path.read_bytes().startswith(whole)
    if kind == "csv":
        table = pd.read_csv(path)
        assert table["step"].tolist() == [1, 1, 3] and table["value"].tolist() == [1.0, 2.0, 3.0]
    else:
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert lines == [{"step": 1, "a": 1.0, "b": 2.0}, {"step": 3, "a": 3.0}]


def test_torn_header_is_rewritten(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes(b"step,na")  # killed while writing the header
    with pytest.warns(TornLineWarning):
        logger = CSVLogger(path, append=True)
    with logger:
        logger.log({"a": 1.0}, 0)
    assert pd.read_csv(path).to_dict("list") == {"step": [0], "name": ["a"], "value": [1.0]}


def test_intact_append_does_not_warn_and_closed_logger_refuses(tmp_path):
    path = tmp_path / "m.jsonl"
    JSONLLogger(path).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logger = JSONLLogger(path, append=True)
    logger.close()
    logger.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        logger.log({"a": 1.0}, 0)
