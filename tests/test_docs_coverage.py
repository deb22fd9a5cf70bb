"""The documentation covers the package (issue 36, item 9).

- every name of ``spectral_hooks.__all__`` and ``spectral_hooks.integrations.__all__`` has a
  docstring of its own and is rendered by some ``::: path`` directive of docs/api/*.md (the
  directive's object, or a member of a module the directive renders);
- every public function, class, method and property (name without a leading ``_``, in a module
  whose path has none) defined in the package has a docstring of its own;
- no docstring example is skipped (0 ``doctest: +SKIP``), and every docstring example of every
  module runs (doctest, in the module's globals; tiny models built from configs, offline), as do
  the examples of docs/api/*.md.

Files not yet there (issue 36, item 9) are listed in ``PENDING_*`` below: their tests are
strict xfails, so each one fails as soon as its file is fixed (or moved) until it is taken off
the list; no new file can join them silently, since every other file must pass.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import inspect
import re
import types
from pathlib import Path

import pytest
import yaml

import spectral_hooks as sh
import spectral_hooks.integrations as integrations

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "spectral_hooks"
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
SKIP_MARK = "doctest: " + "+SKIP"  # split so that this file does not count itself

# ---- not yet done (issue 36, item 9): each entry is a strict xfail; fixing a file fails the test
# until the file leaves the list
#: files with public definitions that have no docstring
PENDING_DOCSTRINGS: frozenset = frozenset()
#: files with skipped docstring examples
PENDING_SKIPS: frozenset = frozenset()
#: modules whose docstring examples fail when run
PENDING_EXAMPLES: frozenset = frozenset()


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _is_public_module(path: Path) -> bool:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return not any(p.startswith("_") and p != "__init__" for p in parts)


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if _is_public_module(p))
ALL_SOURCES = sorted(PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = ("spectral_hooks",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _pending(pending: frozenset, key: str, why: str):
    """A strict xfail for ``key`` if it is in ``pending``: fixing it fails until it is unlisted."""
    if key in pending:
        return pytest.param(key, marks=pytest.mark.xfail(strict=True, reason=why))
    return key


# --------------------------------------------------------------------------- docstrings
def undocumented(tree: ast.Module) -> list[str]:
    """Public functions, classes, methods and properties of ``tree`` without a docstring
    (``@overload`` stubs and setters excepted: the implementation carries it)."""
    missing = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if node.name.startswith("_") or (not isinstance(node, ast.ClassDef)
                                          and _is_overload(node)):
            continue
        if ast.get_docstring(node) is None:
            missing.append(node.name)
        if isinstance(node, ast.ClassDef):
            missing += [f"{node.name}.{m.name}" for m in node.body
                        if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and not m.name.startswith("_") and ast.get_docstring(m) is None
                        and not _is_overload(m)]
    return missing


def _is_overload(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    names = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")
             for d in node.decorator_list}
    return "overload" in names or "setter" in names


def test_undocumented_finds_a_missing_docstring():
    tree = ast.parse('class A:\n    """A."""\n    def f(self): pass\n'
                     '    def _g(self): pass\ndef h(): pass\ndef _k(): pass\n'
                     '@overload\ndef m(x: int) -> int: ...\n')  # an overload: its stub
    assert undocumented(tree) == ["A.f", "h"]


@pytest.mark.parametrize("path", [
    _pending(PENDING_DOCSTRINGS, _relative(p), "owned by another helper of issue 36")
    for p in SOURCES])
def test_public_definitions_have_docstrings(path):
    missing = undocumented(ast.parse((PACKAGE / path).read_text(encoding="utf-8")))
    assert not missing, f"spectral_hooks/{path}: no docstring: {', '.join(missing)}"


@pytest.mark.parametrize("path", [
    _pending(PENDING_SKIPS, _relative(p), "owned by another helper of issue 36")
    for p in ALL_SOURCES])
def test_no_skipped_examples(path):
    lines = [i for i, line in enumerate((PACKAGE / path).read_text(encoding="utf-8")
                                        .splitlines(), 1) if SKIP_MARK in line]
    assert not lines, f"spectral_hooks/{path}: {SKIP_MARK} on line(s) {lines}"


@pytest.mark.parametrize("pending", [PENDING_DOCSTRINGS, PENDING_SKIPS])
def test_pending_files_exist(pending):
    """A moved or deleted file leaves the list (its new path passes, or joins it)."""
    assert not [p for p in pending if not (PACKAGE / p).is_file()]


# --------------------------------------------------------------------------- examples run
def run_examples(tests: list[doctest.DocTest]) -> tuple[doctest.TestResults, str]:
    """Run doctests; (their results, the failure report)."""
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out: list[str] = []
    for test in tests:
        runner.run(test, out=out.append)
    return runner.summarize(verbose=False), "".join(out)[-4000:]


@pytest.mark.usefixtures("registry_restored")
@pytest.mark.parametrize("name", [
    _pending(PENDING_EXAMPLES, _module_name(p), "owned by another helper of issue 36")
    for p in SOURCES])
def test_module_examples_run(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = [t for t in finder.find(module, name, module=module, globs=dict(vars(module)))
             if t.examples]
    result, report = run_examples(tests)
    assert result.failed == 0, f"{name}: {result}\n{report}"


def test_pending_examples_exist():
    assert not [n for n in PENDING_EXAMPLES if importlib.util.find_spec(n) is None]


@pytest.mark.parametrize("page", [p.name for p in API_PAGES])
def test_api_page_examples_run(page):
    text = (ROOT / "docs" / "api" / page).read_text(encoding="utf-8")
    test = doctest.DocTestParser().get_doctest(text, {}, page, page, 0)
    result, report = run_examples([test])
    assert result.failed == 0, f"docs/api/{page}: {result}\n{report}"


def test_the_overview_shows_a_first_call():
    """Not a list of names: instrument, a forward, analyze, a column read."""
    text = (ROOT / "docs" / "api" / "index.md").read_text(encoding="utf-8")
    code = "".join(e.source for e in doctest.DocTestParser().get_examples(text))
    missing = [step for step in ("sh.instrument(model", "model(input_ids", "probe.analyze(",
                                 'report.power["') if step not in code]
    assert not missing, f"docs/api/index.md: the example lacks {missing}"


# --------------------------------------------------------------------------- the reference
def directives(text: str) -> list[tuple[str, dict]]:
    """The ``::: path`` directives of a page with their (YAML) options."""
    found = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = re.match(r"^::: ([\w.]+)\s*$", line)
        if not match:
            continue
        block = []
        for following in lines[i + 1:]:
            if following.strip() and not following.startswith("    "):
                break
            block.append(following[4:])
        options = (yaml.safe_load("\n".join(block)) or {}).get("options", {})
        found.append((match.group(1), options))
    return found


def resolve(path: str) -> object:
    """The object a mkdocstrings path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise LookupError(path)


def module_members(module: types.ModuleType, members: object) -> list[object]:
    """What a module directive renders: its listed members, else its ``__all__`` or the
    public names it defines."""
    if isinstance(members, list):
        names = members
    elif hasattr(module, "__all__"):
        names = list(module.__all__)
    else:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
    return [getattr(module, n) for n in names]


def rendered() -> list[object]:
    """Every object some docs/api page renders."""
    objects: list[object] = []
    for page in API_PAGES:
        for path, options in directives(page.read_text(encoding="utf-8")):
            obj = resolve(path)
            objects.append(obj)
            if isinstance(obj, types.ModuleType) and options.get("members", True) is not False:
                objects += module_members(obj, options.get("members", True))
    return objects


def test_directives_parse():
    page = "# T\n\n::: a.b.C\n\n::: a.d\n    options:\n      members: [x, y]\n\ntext\n"
    assert directives(page) == [("a.b.C", {}), ("a.d", {"members": ["x", "y"]})]


FACE = ([("spectral_hooks", n) for n in sh.__all__ if n != "__version__"]
        + [("spectral_hooks.integrations", n) for n in integrations.__all__])


def own_docstring(module: types.ModuleType, name: str) -> str | None:
    """The object's own docstring (not inherited); for data, the string after its assignment
    in the module that assigns it (what mkdocstrings renders)."""
    obj = getattr(module, name)
    if isinstance(obj, (types.ModuleType, types.FunctionType, type)):
        return obj.__dict__.get("__doc__") if isinstance(obj, type) else obj.__doc__
    for source in SOURCES:
        body = ast.parse(source.read_text(encoding="utf-8")).body
        for node, after in zip(body, body[1:]):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                        and isinstance(after.value.value, str):
                    return after.value.value
    return None


@pytest.mark.parametrize(("module", "name"), FACE)
def test_face_names_documented(module, name):
    doc = own_docstring(importlib.import_module(module), name)
    assert doc and doc.strip(), f"{module}.{name}: no docstring of its own"


def test_face_names_on_an_api_page():
    shown = rendered()
    missing = [f"{module}.{name}" for module, name in FACE
               if not any(getattr(importlib.import_module(module), name) is o for o in shown)]
    assert not missing, f"not rendered by any docs/api/*.md directive: {missing}"


#: top-level modules that are the probe's and the recording's internals, not API of their own
NOT_ON_A_PAGE = frozenset({"checks"})


def test_every_public_subpackage_has_a_page():
    """Each public subpackage and top-level module is rendered (itself or a member)."""
    shown = rendered()
    modules = {m.__name__ for m in map(inspect.getmodule, shown) if m is not None}
    tops = {_module_name(p).split(".")[1] for p in SOURCES if _module_name(p) != "spectral_hooks"}
    unshown = sorted(t for t in tops
                     if not any(m == f"spectral_hooks.{t}" or m.startswith(f"spectral_hooks.{t}.")
                                for m in modules) and t not in NOT_ON_A_PAGE)
    assert not unshown, f"no docs/api page renders anything of: {unshown}"
