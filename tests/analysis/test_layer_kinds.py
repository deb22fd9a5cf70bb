"""The ``mixer`` and ``mlp`` columns (issue 54): every table whose ``layer`` is one block carries
that block's kinds, the anatomy's, as categories over ``anatomy.mixers``' fixed kinds; they
survive save/load, the distributed merge and the HTML report, and never reach a scalar logger.

Expectations are written out per architecture (what each config stacks), not read back from the
anatomy the columns come from.
"""

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, cast

import pandas as pd
import pytest
import torch

import spectral_hooks as sh
from spectral_hooks.analysis.columns import LAYER_KINDS, SCHEMAS
from spectral_hooks.anatomy import Anatomy
from spectral_hooks.anatomy.mixers import MIXERS, MLPS
from spectral_hooks.errors import OptionError
from spectral_hooks.integrations.loggers import flatten_power
from spectral_hooks.integrations.power_log import jacobian_metrics, power_metrics
from spectral_hooks.report.compare import compare_sections
from tests.families.configs_hybrid import make as make_hybrid
from tests.tiny_models import make_bridge, make_model

ROOT = Path(__file__).resolve().parents[2]
WITH_KINDS = sorted(name for name, schema in SCHEMAS.items()
                    if all(column in schema.columns for column in LAYER_KINDS))
ALL_VIEWS: dict[str, Any] = dict(jacobian={"k": 4}, bottleneck=True, topology=True,
                                 idealised=True)


def _ids(vocab: int = 100) -> torch.Tensor:
    return torch.randint(1, vocab, (2, 7), generator=torch.Generator().manual_seed(3))


def _probe(model: torch.nn.Module, vocab: int = 100):
    with sh.instrument(model) as probe, torch.no_grad():
        model(_ids(vocab))
    return probe


def _analyze(probe: Any, **options: Any) -> sh.Report:
    report = probe.analyze(progress=False, **options)
    assert isinstance(report, sh.Report)
    return report


def _kinds(table: pd.DataFrame) -> dict[int, tuple[str, str]]:
    """{layer: (mixer, mlp)} of a table, checking that each layer has one kind."""
    pairs = table[["layer", "mixer", "mlp"]].astype({"mixer": object, "mlp": object})
    unique = pairs.drop_duplicates()
    assert not unique["layer"].duplicated().any(), unique
    return {int(r.layer): (r.mixer, r.mlp) for r in unique.itertuples()}


def _assert_categorical(table: pd.DataFrame) -> None:
    for column, kinds in (("mixer", MIXERS), ("mlp", MLPS)):
        assert isinstance(table[column].dtype, pd.CategoricalDtype), column
        assert tuple(table[column].cat.categories) == kinds, column
    at = list(table.columns).index("layer")
    assert list(table.columns)[at + 1:at + 3] == ["mixer", "mlp"]


def test_the_sections_with_kinds_are_the_ones_whose_layer_is_one_block():
    assert WITH_KINDS == sorted(["power", "cross_power", "spectra", "idealised", "jacobian",
                                 "jacobian_summary", "propagation", "topology", "units",
                                 "communities"])
    for name in ("shared_weights", "reinit_test"):  # said why in the layer's meaning
        assert "mixer/mlp" in cast(Any, SCHEMAS[name].column("layer")).meaning


@pytest.mark.parametrize("name, kinds", [
    ("lfm2", {0: ("short_conv", "dense"), 1: ("gqa", "dense")}),
    ("jamba", {0: ("state_space", "dense"), 1: ("gqa", "routed")}),
])
def test_hybrid_power_has_attention_rows_only_jacobian_every_layer(name, kinds):
    report = _analyze(_probe(make_hybrid(name)), jacobian={"k": 4})
    attention = {t: k for t, k in kinds.items() if k[0] in ("mha", "gqa", "mqa", "mla")}
    assert _kinds(report["power"]) == attention
    assert _kinds(report["jacobian"]) == kinds
    spectra = report["spectra"]
    assert _kinds(spectra.loc[spectra["source"] == "jacobian"]) == kinds
    assert _kinds(spectra.loc[spectra["source"] == "F"]) == attention
    for section in ("power", "jacobian", "spectra"):
        _assert_categorical(report[section])
    assert report["jacobian"].groupby("mixer", observed=True).size().to_dict() == {
        mixer: 1 for mixer, _ in kinds.values()}


def test_gpt2_every_layer_table_says_mha_dense():
    report = _analyze(_probe(make_model("gpt2")), **ALL_VIEWS)
    assert set(WITH_KINDS) - {"cross_power", "jacobian_summary"} <= set(report.sections)
    for section in report.sections:
        table = report[section]
        if section in WITH_KINDS:
            _assert_categorical(table)
            assert _kinds(table) == {0: ("mha", "dense"), 1: ("mha", "dense")}, section
        else:
            assert "mixer" not in table.columns and "mlp" not in table.columns, section


def test_gqa_llama_says_gqa_and_summary_keeps_it():
    report = _analyze(_probe(make_model("llama")), jacobian={"k": 4, "samples": "all"})
    for section in ("power", "jacobian", "jacobian_summary"):
        assert _kinds(report[section]) == {0: ("gqa", "dense"), 1: ("gqa", "dense")}, section


def test_bert_encoder_says_mha():
    report = _analyze(_probe(make_model("bert")), jacobian={"k": 4})
    assert _kinds(report["power"]) == _kinds(report["jacobian"]) == {0: ("mha", "dense"),
                                                                1: ("mha", "dense")}


def test_transformerlens_bridge_says_mha():
    pytest.importorskip("transformer_lens.model_bridge")
    bridge = make_bridge("gpt2")
    report = _analyze(_probe(bridge), jacobian={"k": 4})
    assert report.metadata["layer_mixers"] == ["mha", "mha"]
    assert _kinds(report["power"]) == _kinds(report["jacobian"]) == {0: ("mha", "dense"),
                                                                1: ("mha", "dense")}


def test_t5_stacks_say_mha_cross_power_too():
    from transformers import T5Config, T5Model

    torch.manual_seed(0)
    model = T5Model(T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                             vocab_size=100)).eval()
    with sh.instrument(model) as probe, torch.no_grad():
        model(input_ids=_ids(), decoder_input_ids=_ids())
    reports = cast(dict, probe.analyze(progress=False))
    for stack in ("encoder", "decoder"):
        assert _kinds(reports[stack]["power"]) == {0: ("mha", "dense"), 1: ("mha", "dense")}
    assert _kinds(reports["decoder"]["cross_power"]) == {0: ("mha", "dense"),
                                                         1: ("mha", "dense")}


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_save_load_keeps_the_columns_and_every_category(tmp_path, fmt):
    pytest.importorskip("pyarrow") if fmt == "parquet" else None
    report = _analyze(_probe(make_hybrid("lfm2")), jacobian={"k": 4})
    path = report.save(tmp_path / "r", format=fmt)
    loaded = sh.Report.load(path)
    for section in ("power", "jacobian", "spectra"):
        pd.testing.assert_frame_equal(loaded[section], report[section], check_exact=True)
        _assert_categorical(loaded[section])
    assert "short_conv" in loaded["jacobian"]["mixer"].tolist()


def test_html_shows_the_kind_next_to_the_layer(tmp_path):
    report = _analyze(_probe(make_hybrid("lfm2")), jacobian={"k": 4})
    html = report.to_html(figures=False)
    assert html.count(">short_conv<") >= 2  # the jacobian summary and its full table
    assert html.count(">gqa<") >= 3  # and power's


def test_compare_keeps_the_kinds_where_both_reports_agree():
    report = _analyze(_probe(make_hybrid("lfm2")), jacobian={"k": 4})
    diff = report.compare(report)
    assert list(diff["jacobian"].columns[:4]) == ["variant", "layer", "mixer", "mlp"]
    assert _kinds(diff["jacobian"]) == {0: ("short_conv", "dense"), 1: ("gqa", "dense")}
    assert "mixer" not in diff.metadata["compare"]["notes"].get("jacobian", {}).get(
        "dropped_columns", [])
    mine = {"power": pd.DataFrame({"layer": [0], "mixer": ["mha"], "gap_ratio": [0.5]})}
    other = {"power": pd.DataFrame({"layer": [0], "mixer": ["gqa"], "gap_ratio": [0.25]})}
    out, info = compare_sections(mine, other, mine_metadata={}, other_metadata={})
    assert list(out["power"].columns) == ["layer", "gap_ratio"]  # kinds differ: not kept
    assert info["notes"]["power"]["dropped_columns"] == ["mixer"]


def test_distributed_merge_keeps_the_categories(tmp_path):
    import torch.distributed as dist

    probe = _probe(make_hybrid("lfm2"))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                            world_size=1)
    try:
        report = _analyze(probe, jacobian={"k": 4}, distributed=True)
    finally:
        dist.destroy_process_group()
    _assert_categorical(report["jacobian"])
    assert _kinds(report["jacobian"]) == {0: ("short_conv", "dense"), 1: ("gqa", "dense")}


def test_a_registered_anatomy_without_kinds_leaves_them_missing():
    from spectral_hooks.analysis.layer_kinds import with_layer_kinds

    anatomy = cast(Anatomy, sh.anatomy_of(make_model("gpt2")))
    bare = anatomy.replace(layers=tuple(dataclasses.replace(p, mixer=None, mlp=None)
                                        for p in anatomy.layers))
    table = with_layer_kinds(pd.DataFrame({"layer": [0, 1], "gap_ratio": [0.5, 0.25]}), bare,
                             SCHEMAS["power"])
    assert table["mixer"].isna().all() and table["mlp"].isna().all()
    for column in LAYER_KINDS:  # nullable: such a table still validates
        assert column.problem(table[column.name]) is None
    assert LAYER_KINDS[0].problem(pd.Series(["rwkv"])) is not None


def test_scalar_loggers_take_no_text_column():
    probe = _probe(make_model("gpt2"))
    report = _analyze(probe, jacobian={"k": 4})
    with pytest.raises(OptionError, match="mixer"):
        flatten_power(report, columns=["gap_ratio", "mixer"])
    with pytest.raises(OptionError, match="mlp"):
        power_metrics(probe, columns=["mlp"])
    with pytest.raises(OptionError, match="mixer"):
        jacobian_metrics(probe, options={"k": 4}, columns=["mixer"])
    logged = jacobian_metrics(probe, options={"k": 4}, columns=["*"])  # a pattern skips text
    assert logged and all(isinstance(v, float) and math.isfinite(v) for v in logged.values())
    assert not [name for name in logged if re.search(r"/(mixer|mlp|token|variant)$", name)]
    assert "spectral/layer_01/jacobian/top_eig_abs" in logged
    probe.remove()


def test_the_guide_lists_every_kind_and_what_each_view_covers():
    guide = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    lines = [line.strip() for line in guide.splitlines()]
    start = lines.index("| mixer | models | power view | Jacobian view |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    listed = {kind for row in rows for kind in re.findall(r"`([a-z_+]+)`", row[0])}
    assert listed == set(MIXERS)
    assert all(len(row) == 4 and row[2] and row[3] for row in rows)  # each view says
    assert all(f"`{mlp}`" in guide for mlp in MLPS)
    assert "`mixer` and `mlp` columns" in guide


def test_the_same_table_gets_the_same_labelled_frame_while_it_lives():
    import gc

    from spectral_hooks.analysis import layer_kinds

    anatomy = cast(Anatomy, sh.anatomy_of(make_model("gpt2")))
    table = pd.DataFrame({"layer": [0, 1], "gap_ratio": [0.5, 0.25]})
    first = layer_kinds.with_layer_kinds(table, anatomy, SCHEMAS["power"])
    assert layer_kinds.with_layer_kinds(table, anatomy, SCHEMAS["power"]) is first
    key = (id(table), "power")
    assert key in layer_kinds._DONE
    del table
    gc.collect()
    assert key not in layer_kinds._DONE  # nothing kept once the table is gone
