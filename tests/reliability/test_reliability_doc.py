"""docs/reliability.md names only tests that exist, and every reliability test file is named."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "reliability.md").read_text()


def test_every_named_test_exists():
    named = re.findall(r"`(tests/\w+/)?(test_\w+\.py)(?:::(\w+))?`", DOC)
    assert len(named) >= 15
    for folder, filename, name in named:
        source = (ROOT / (folder or "tests/reliability/") / filename).read_text()
        if name:
            assert f"def {name}(" in source, f"{filename}::{name} named in the doc is missing"
    for short in re.findall(r"`::(\w+)`", DOC):
        assert any(f"def {short}(" in p.read_text()
                   for p in (ROOT / "tests" / "reliability").glob("test_*.py")), short


def test_every_reliability_test_file_is_in_the_doc():
    for path in (ROOT / "tests" / "reliability").glob("test_*.py"):
        if path.name != "test_reliability_doc.py":
            assert path.name in DOC, f"{path.name} is not in docs/reliability.md"
