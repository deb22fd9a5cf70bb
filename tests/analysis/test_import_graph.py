"""The package's imports point one way: down the layers of DESIGN.md, no circles.

Read from the source (every import statement, including those inside functions), so a lazy
import cannot hide an upward dependency.
"""

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2] / "spectral_hooks"

# rank of each module group: a module may import only groups of lower or equal rank
RANKS = {
    "errors": 0, "checks": 0, "_version": 0, "linalg": 0,
    "metrics": 1, "recording": 1, "anatomy": 1, "report": 1,
    "linearize": 3, "steering": 3,
    "analysis": 4,
    "hooks": 5, "probe": 5, "encoder_decoder": 5,  # hooks/: the probe's machinery
    "": 6,  # the package face, spectral_hooks/__init__.py
    "cli": 7, "integrations": 7,
}
# groups that must not import each other although ranks allow it (DESIGN.md layering rules)
FORBIDDEN = {
    ("metrics", "anatomy"), ("metrics", "recording"), ("metrics", "report"),
    ("report", "metrics"), ("report", "anatomy"), ("report", "recording"),
    ("anatomy", "metrics"), ("anatomy", "report"), ("recording", "metrics"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(["spectral_hooks", *parts])] = path
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".")
    is_package = MODULES[module].name == "__init__.py"
    base = package if is_package else package[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("spectral_hooks")}
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if not target.startswith("spectral_hooks"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    return {m for m in found if m in MODULES and m != module}


def _group(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


GRAPH = nx.DiGraph()
for _m in MODULES:
    GRAPH.add_node(_m)
    GRAPH.add_edges_from((_m, t) for t in _imports(_m))


def test_every_module_has_a_rank():
    assert {_group(m) for m in MODULES} <= set(RANKS), set(map(_group, MODULES)) - set(RANKS)


def test_no_module_imports_one_above_it():
    upward = [(a, b) for a, b in GRAPH.edges if RANKS[_group(b)] > RANKS[_group(a)]]
    assert not upward, upward


def test_forbidden_pairs():
    bad = [(a, b) for a, b in GRAPH.edges if (_group(a), _group(b)) in FORBIDDEN]
    assert not bad, bad


@pytest.mark.parametrize("lower", ["analysis", "linearize", "metrics", "linalg", "report",
                                   "anatomy", "recording", "steering"])
def test_lower_layers_never_import_the_probe_or_the_package_face(lower):
    bad = [(a, b) for a, b in GRAPH.edges
           if _group(a) == lower and b in ("spectral_hooks", "spectral_hooks.probe")]
    assert not bad, bad


def test_no_circle():
    """Not one: imports under ``if TYPE_CHECKING:`` and inside functions count too."""
    cycles = [sorted(c) for c in nx.strongly_connected_components(GRAPH) if len(c) > 1]
    assert not cycles, cycles


def _family_files() -> set[str]:
    """The modules :mod:`spectral_hooks.anatomy.families` lists (the built-in families)."""
    return _imports("spectral_hooks.anatomy.families")


def test_the_anatomy_registry_imports_no_family():
    """Families register into the registry; one module lists them, the anatomy package imports
    that list, and nothing below the list reaches a family file."""
    families = _family_files()
    assert {"spectral_hooks.anatomy.bert", "spectral_hooks.anatomy.tlens"} <= families
    registry = "spectral_hooks.anatomy.registry"
    assert not nx.descendants(GRAPH, registry) & (families | {"spectral_hooks.anatomy.families"})
    assert set(GRAPH.predecessors("spectral_hooks.anatomy.families")) == {"spectral_hooks.anatomy"}

