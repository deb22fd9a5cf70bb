"""Saved reports are written atomically and verified on load: 12 ways of damaging one, each
refused with a clear error naming the file (issue 16: a truncated CSV used to load as a NaN row,
a manifest claiming 999 rows loaded, a column could change dtype, a missing key was a KeyError).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from spectral_hooks.report import Report, ReportIntegrityError


def _report() -> Report:
    rng = np.random.default_rng(0)
    n = 12
    power = pd.DataFrame({
        "layer": np.arange(n), "gap_ratio": rng.uniform(0, 1, n), "erank": rng.uniform(1, 9, n),
        "lambda1_is_complex": rng.uniform(0, 1, n) > 0.5,
        "family": pd.Series(["gpt2"] * n, dtype="string"),
    })
    jac = pd.DataFrame({"layer": np.repeat(np.arange(3), 4), "index": np.tile(np.arange(4), 3),
                        "eig_real": rng.normal(size=12), "converged": np.ones(12, bool)})
    return Report({"power": power, "jacobian": jac}, {"model": "demo", "k": 4})


def _manifest(root: Path) -> dict:
    return json.loads((root / "metadata.json").read_text())


def _write_manifest(root: Path, manifest: dict) -> None:
    (root / "metadata.json").write_text(json.dumps(manifest, indent=2))


def _truncate(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2
    data[i] = ord("7") if data[i] != ord("7") else ord("3")  # same length, still parseable
    path.write_bytes(bytes(data))


def _edit_manifest(fn):
    def damage(root: Path, fmt: str) -> None:
        manifest = _manifest(root)
        fn(manifest, fmt)
        _write_manifest(root, manifest)
    return damage


def _set_rows(m, fmt):
    m["sections"]["power"]["n_rows"] = 999


def _set_dtype(m, fmt):
    m["sections"]["power"]["columns"][1]["dtype"] = "int64"


def _drop_key(m, fmt):
    del m["sections"]["power"]["columns"]


def _drop_checksum(m, fmt):
    del m["manifest_sha256"]


def _swap_files(m, fmt):
    m["sections"]["power"]["file"], m["sections"]["jacobian"]["file"] = (
        m["sections"]["jacobian"]["file"], m["sections"]["power"]["file"])


DAMAGES = {
    "truncated section file": lambda root, fmt: _truncate(root / f"power.{fmt}"),
    "flipped byte in a section file": lambda root, fmt: _flip_byte(root / f"power.{fmt}"),
    "row appended to a section file": lambda root, fmt: (root / f"power.{fmt}").write_bytes(
        (root / f"power.{fmt}").read_bytes() + b"12,0.5,3.0,False,\"\"\"gpt2\"\"\"\n"),
    "section file deleted": lambda root, fmt: (root / f"power.{fmt}").unlink(),
    "section file emptied": lambda root, fmt: (root / f"power.{fmt}").write_bytes(b""),
    "manifest claims 999 rows": _edit_manifest(_set_rows),
    "manifest changes a column dtype": _edit_manifest(_set_dtype),
    "manifest misses a key": _edit_manifest(_drop_key),
    "manifest checksum removed": _edit_manifest(_drop_checksum),
    "manifest swaps two files": _edit_manifest(_swap_files),
    "manifest truncated": lambda root, fmt: _truncate(root / "metadata.json", 0.5),
    "manifest not UTF-8": lambda root, fmt: (root / "metadata.json").write_bytes(b"\xff\xfe{}"),
}


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_report_is_refused(tmp_path, fmt, damage):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    root = _report().save(tmp_path / "r", format=fmt)
    Report.load(root)  # intact: loads
    DAMAGES[damage](root, fmt)
    with pytest.raises((ReportIntegrityError, FileNotFoundError)) as info:
        Report.load(root)
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert "metadata.json" in message or "power" in message  # names the file or section
    if isinstance(info.value, ReportIntegrityError):
        assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_shape_and_dtype_checked_even_without_verification(tmp_path, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    for damage, match in [(_set_rows, "999"), (_set_dtype, "int64|float64")]:
        root = _report().save(tmp_path / damage.__name__, format=fmt)
        _edit_manifest(damage)(root, fmt)
        with pytest.raises(ReportIntegrityError, match=match):
            Report.load(root, verify=False)
    root = _report().save(tmp_path / "t", format="csv")
    _truncate(root / "power.csv")  # the torn last row used to load as a NaN row
    with pytest.raises(ReportIntegrityError):
        Report.load(root, verify=False)


def test_verify_false_loads_a_report_edited_on_purpose(tmp_path):
    rep = _report()
    root = rep.save(tmp_path / "r", format="csv")
    path = root / "power.csv"
    path.write_text(path.read_text().replace("gpt2", "gpt-2"))
    with pytest.raises(ReportIntegrityError, match="verify=False"):
        Report.load(root)
    back = Report.load(root, verify=False)
    assert list(back.power["family"].unique()) == ["gpt-2"]
    assert_frame_equal(back.jacobian, rep.jacobian, check_exact=True)


def test_save_is_atomic_and_records_checksums(tmp_path):
    import hashlib

    root = _report().save(tmp_path / "r", format="csv")
    assert sorted(p.name for p in root.iterdir()) == ["jacobian.csv", "metadata.json", "power.csv"]
    manifest = _manifest(root)
    for name, info in manifest["sections"].items():
        data = (root / info["file"]).read_bytes()
        assert info["size"] == len(data) and info["sha256"] == hashlib.sha256(data).hexdigest()
        assert info["n_rows"] == 12 and set(info["dtypes"]) >= {"layer"}
    # saving again over a report replaces it whole and leaves no temp file behind
    _report().save(root, format="csv")
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]
    Report.load(root)


def test_schema_1_reports_still_load(tmp_path):
    """Reports saved before checksums existed (the golden ones) load; shape still checked."""
    rep = _report()
    root = rep.save(tmp_path / "r", format="csv")
    manifest = _manifest(root)
    manifest["schema_version"] = 1
    del manifest["manifest_sha256"]
    for info in manifest["sections"].values():
        del info["size"], info["sha256"]
    _write_manifest(root, manifest)
    assert_frame_equal(Report.load(root).power, rep.power, check_exact=True)
    manifest["sections"]["power"]["n_rows"] = 999
    _write_manifest(root, manifest)
    with pytest.raises(ReportIntegrityError, match="999"):
        Report.load(root)
