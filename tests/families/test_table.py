"""README's table of supported models is the one generated from the families' declared facts
(regenerate: ``python -m spectral_hooks.anatomy.table --write README.md``)."""

from pathlib import Path

import pytest

from spectral_hooks.anatomy import FamilyInfo, register_anatomy, registry
from spectral_hooks.anatomy.table import main, replace_table, supported_models_table, table_in

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_table_is_the_generated_one():
    assert table_in(README.read_text()) == supported_models_table(), (
        "README.md's supported-models table is stale: run "
        "`python -m spectral_hooks.anatomy.table --write README.md`")


def test_every_built_in_family_is_a_row_and_user_families_are_not():
    info = FamilyInfo("mine", ("mine",), causal="yes", norm_placement="pre")
    register_anatomy("mine", lambda model: None, info=info)
    try:
        table = supported_models_table()
    finally:
        registry._REGISTRY.pop(0), registry._INFOS.pop("mine")
    rows = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines()[2:]]
    for family in ("bert", "distilbert", "modernbert", "deberta_v2", "mpnet", "vit", "deit",
                   "clip_vision", "siglip_vision", "clip_text", "generic fallback"):
        assert family in rows
    assert "mine" not in rows


def test_write_replaces_only_the_table(tmp_path):
    text = README.read_text()
    path = tmp_path / "README.md"
    path.write_text(replace_table(text, "| stale |\n"))
    assert main(["--write", str(path)]) == 0
    assert path.read_text() == text
    with pytest.raises(ValueError, match="markers"):
        replace_table("no markers here", "")
