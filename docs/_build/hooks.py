"""mkdocs hook: pages that live outside docs/ join the site without a hand-kept copy.

README.md becomes the home page and benchmarks/RESULTS.md (with the write-ups under
benchmarks/results/) the results page; their links, written for the repository's layout, are
rewritten for the site's (``docs/guide.md`` -> ``guide.md``, ``benchmarks/RESULTS.md`` ->
``results.md``)."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]


def _readme() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = re.sub(r"\]\(docs/", "](", text)
    text = re.sub(r"\]\(benchmarks/results/", "](results/", text)
    return re.sub(r"\]\(benchmarks/RESULTS\.md", "](results.md", text)


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "index.md", content=_readme()))
    results = ROOT / "benchmarks"
    files.append(File.generated(config, "results.md",
                                content=(results / "RESULTS.md").read_text(encoding="utf-8")))
    for path in sorted((results / "results").rglob("*")):
        if path.is_file():
            name = path.relative_to(results / "results").as_posix()
            files.append(File.generated(config, f"results/{name}", abs_src_path=str(path)))
    return files
