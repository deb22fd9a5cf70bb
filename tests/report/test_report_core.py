"""Report: lazy sections, exact save/load (Parquet and CSV), compare, errors."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

import spectral_hooks
import spectral_hooks.report.storage as storage
from spectral_hooks.report import Report
from spectral_hooks.report.compare import KEY_COLUMNS


def tricky_frame() -> pd.DataFrame:
    """Every dtype a report table may hold, with NaN, None, empty and odd strings."""
    return pd.DataFrame({
        "layer": np.arange(4, dtype=np.int64),
        "small": np.array([1, -2, 3, 0], dtype=np.int32),
        "big": np.array([2**64 - 1, 0, 5, 7], dtype=np.uint64),
        "x": [1 / 3, np.nan, -np.inf, 1e-300],
        "x32": np.array([0.1, np.nan, 3.5, -0.0], dtype=np.float32),
        "flag": [True, False, True, False],
        "name": ["a", None, "", "NA"],
        "obj": pd.Series(["x,y", None, float("nan"), 'quote " and\nnewline'], dtype=object),
        "z": np.array([1 + 2j, complex(np.nan, 0), 0.1j, -1e-20 - 3j]),
        "cat": pd.Categorical(["u", None, "v", "u"], categories=["v", "u", "w"]),
        "nint": pd.array([1, None, 3, -4], dtype="Int64"),
        "nbool": pd.array([True, None, False, True], dtype="boolean"),
    })


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_round_trip_exact(tmp_path, fmt, make_sections):
    sections = make_sections(seed=1)
    sections["extra"] = tricky_frame()
    sections["indexed"] = tricky_frame().set_index(["layer", "name"])
    sections["empty"] = tricky_frame().iloc[:0]
    rep = Report(sections, {"model": "m", "options": {"k": 8, "positions": ["last"]}, "t": 0.25})
    rep.save(tmp_path, format=fmt)
    assert (tmp_path / "metadata.json").is_file()
    assert (tmp_path / f"power.{fmt}").is_file()
    back = Report.load(tmp_path)
    assert back.sections == rep.sections
    for name in rep.sections:
        assert_frame_equal(rep[name], back[name], check_exact=True)
    assert back.metadata == {**rep.metadata, "spectral_hooks_version": spectral_hooks.__version__}
    assert "spectral_hooks_version" not in rep.metadata  # save does not mutate
    manifest = json.loads((tmp_path / "metadata.json").read_text())
    assert manifest["schema_version"] == storage.SCHEMA_VERSION
    assert manifest["sections"]["extra"]["dtypes"]["z"] == "complex128"
    assert manifest["sections"]["extra"]["dtypes"]["flag"] == "bool"


def test_csv_used_when_pyarrow_absent(tmp_path, monkeypatch, make_report):
    monkeypatch.setattr(storage, "_HAVE_PYARROW", False)
    rep = make_report()
    rep.save(tmp_path)
    assert (tmp_path / "power.csv").is_file() and not list(tmp_path.glob("*.parquet"))
    back = Report.load(tmp_path)
    for name in rep.sections:
        assert_frame_equal(rep[name], back[name], check_exact=True)
    with pytest.raises(ImportError, match="pyarrow"):
        rep.save(tmp_path / "p", format="parquet")


def test_parquet_report_needs_pyarrow_to_load(tmp_path, monkeypatch, make_report):
    make_report().save(tmp_path, format="parquet")
    monkeypatch.setattr(storage, "_HAVE_PYARROW", False)
    with pytest.raises(ImportError, match="pyarrow"):
        Report.load(tmp_path)


def test_lazy_sections_called_once_and_threadsafe():
    calls = []

    def compute():
        calls.append(1)
        time.sleep(0.05)
        return pd.DataFrame({"layer": [0, 1], "gamma": [0.1, 0.2]})

    rep = Report({"power": compute, "jacobian": lambda: None}, {})
    assert rep.sections == ["power", "jacobian"] and not calls
    assert not rep.is_computed("power")
    threads = [threading.Thread(target=lambda: rep.power) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rep.power is rep["power"] is rep.get("power")
    assert len(calls) == 1 and rep.is_computed("power")
    assert rep.jacobian is None  # a callable may find the analysis unavailable


def test_lazy_section_wrong_type():
    rep = Report({"power": lambda: [1, 2]}, {})
    with pytest.raises(TypeError, match="power"):
        rep.power


def test_missing_sections(make_sections):
    rep = Report({"power": make_sections()["power"]}, {"model": "m"})
    assert rep.sections == ["power"]
    for name in ("spectra", "jacobian", "bottleneck", "topology", "units", "propagation", "shared_weights", "trends"):
        assert getattr(rep, name) is None
    with pytest.raises(KeyError, match="present"):
        rep["jacobian"]
    assert "power" in rep and "jacobian" not in rep and len(rep) == 1
    assert "model='m'" in repr(rep)


def test_bad_inputs(make_report):
    with pytest.raises(ValueError, match="section name"):
        Report({"../evil": pd.DataFrame()}, {})
    with pytest.raises(TypeError, match="DataFrame"):
        Report({"power": [1, 2, 3]}, {})
    with pytest.raises(ValueError, match="format"):
        make_report().save("/tmp/unused", format="xlsx")


def test_bad_directory(tmp_path, make_report):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    rep = make_report()
    with pytest.raises(OSError, match="not a directory"):
        rep.save(blocker)
    with pytest.raises(OSError, match="cannot create directory"):
        rep.save(blocker / "sub")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write to read-only dirs")
def test_unwritable_directory(tmp_path, make_report):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(OSError, match="not writable"):
            make_report().save(ro)
    finally:
        ro.chmod(0o700)


def test_unstorable_values(tmp_path):
    with pytest.raises(ValueError, match="JSON"):
        Report({}, {"bad": object()}).save(tmp_path / "a")
    Report({}, {"np": np.float32(1.5), "arr": np.arange(3)}).save(tmp_path / "b")
    assert Report.load(tmp_path / "b").metadata["arr"] == [0, 1, 2]
    with pytest.raises(TypeError, match="datetime"):
        Report({"t": pd.DataFrame({"when": pd.to_datetime(["2024-01-01"])})}, {}).save(tmp_path / "c")
    with pytest.raises(ValueError, match="not a string"):
        Report({"t": pd.DataFrame({0: [1]})}, {}).save(tmp_path / "d")


def test_load_errors(tmp_path, make_report):
    with pytest.raises(FileNotFoundError, match="not found"):
        Report.load(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="metadata.json"):
        Report.load(tmp_path)
    make_report().save(tmp_path / "r")
    path = tmp_path / "r" / "metadata.json"
    manifest = json.loads(path.read_text())
    manifest["schema_version"] = storage.SCHEMA_VERSION + 1
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="newer"):
        Report.load(tmp_path / "r")
    manifest["schema_version"] = storage.SCHEMA_VERSION
    manifest["sections"]["power"]["file"] = "../../etc/passwd"
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="invalid file"):
        Report.load(tmp_path / "r")


def test_compare_with_itself_is_zero(make_report):
    rep = make_report()
    diff = rep.compare(rep)
    assert diff.sections == rep.sections
    assert diff.metadata["compare"]["sign"] == "self - other"
    for name in rep.sections:
        d = diff[name]
        assert len(d) == len(rep[name])
        keys = [c for c in KEY_COLUMNS if c in rep[name].columns]
        assert_frame_equal(d[keys], rep[name][keys].reset_index(drop=True))
        values = d.drop(columns=keys)
        assert len(values.columns) > 0
        arr = values.to_numpy(dtype=float)
        both_nan = np.isnan(rep[name][values.columns].to_numpy(dtype=float))
        assert np.all((arr == 0) | both_nan), name


def test_compare_hand_computation():
    before = pd.DataFrame({"layer": [0, 1, 2], "gamma": [0.1, 0.2, 0.3], "erank": [10, 20, 30],
                           "lambda1_is_complex": [False, True, True], "note": ["a", "b", "c"]})
    after = pd.DataFrame({"layer": [2, 0, 1, 3], "gamma": [0.5, 0.1, np.nan, 9.0], "erank": [31, 8, 20, 1],
                          "lambda1_is_complex": [True, True, False, False], "note": ["x", "y", "z", "w"]})
    bn_before = pd.DataFrame({"variant": ["trained", "trained", "init"], "depth": [1, 2, 1], "erank": [5.0, 3.0, 9.0]})
    bn_after = pd.DataFrame({"variant": ["init", "trained", "trained"], "depth": [1, 2, 1], "erank": [8.0, 1.0, 6.0]})
    units = pd.DataFrame({"layer": [0], "unit": [0]})
    a = Report({"power": after, "bottleneck": bn_after, "units": units}, {"model": "after"})
    b = Report({"power": before, "bottleneck": bn_before, "jacobian": pd.DataFrame({"layer": [0]})},
               {"model": "before"})
    diff = a.compare(b)  # after minus before
    expected = pd.DataFrame({"layer": [2, 0, 1], "gamma": [0.5 - 0.3, 0.0, np.nan], "erank": [1, -2, 0],
                             "lambda1_is_complex": [0, 1, -1]})
    assert_frame_equal(diff.power, expected)
    assert_frame_equal(diff.bottleneck, pd.DataFrame({"variant": ["init", "trained", "trained"],
                                                      "depth": [1, 2, 1], "erank": [-1.0, -2.0, 1.0]}))
    info = diff.metadata["compare"]
    assert info["self"]["model"] == "after" and info["other"]["model"] == "before"
    assert info["skipped_sections"] == {"units": "not present in other", "jacobian": "not present in self"}
    assert info["notes"]["power"]["rows_only_in_self"] == 1
    assert info["notes"]["power"]["dropped_columns"] == ["note"]
    assert diff.sections == ["power", "bottleneck"]
    # the reverse direction flips the sign
    rev = b.compare(a)
    assert np.allclose(rev.bottleneck.sort_values(["variant", "depth"])["erank"].to_numpy(),
                       -diff.bottleneck.sort_values(["variant", "depth"])["erank"].to_numpy())


def test_compare_duplicate_keys_and_no_keys():
    a = Report({"s": pd.DataFrame({"layer": [0, 0, 1], "v": [1.0, 2.0, 3.0]}),
                "t": pd.DataFrame({"v": [1.0, 2.0]})}, {})
    b = Report({"s": pd.DataFrame({"layer": [0, 0, 1], "v": [0.5, 0.5, 0.5]}),
                "t": pd.DataFrame({"v": [0.0, 1.0]})}, {})
    d = a.compare(b)
    assert d["s"]["v"].tolist() == [0.5, 1.5, 2.5]
    assert d["t"]["v"].tolist() == [1.0, 1.0]
    assert "row order" in d.metadata["compare"]["notes"]["t"]["matched_by"]
    with pytest.raises(TypeError):
        a.compare("not a report")


def test_repr_html_does_not_compute_lazy_sections(make_sections):
    calls = []
    rep = Report({"power": make_sections()["power"],
                  "jacobian": lambda: calls.append(1) or make_sections()["jacobian"]},
                 {"model": "<b>m</b>"})
    out = rep._repr_html_()
    assert "not computed yet" in out and not calls
    assert "&lt;b&gt;m&lt;/b&gt;" in out and "<b>m</b>" not in out
    assert "gap_ratio" in out


def test_saved_compare_report_round_trips(tmp_path, make_report):
    rep = make_report()
    diff = rep.compare(make_report(seed=3))
    diff.save(tmp_path)
    back = Report.load(tmp_path)
    for name in diff.sections:
        assert_frame_equal(diff[name], back[name], check_exact=True)
