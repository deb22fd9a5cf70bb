"""Appending benchmark rows to a JSON-lines results file (``--out`` of several scripts)."""

from __future__ import annotations

import json
from typing import Iterable, Optional


def append_jsonl(path: Optional[str], rows: Iterable[dict]) -> None:
    """Append each row as one JSON line to ``path``; nothing when ``path`` is empty."""
    if not path:
        return
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
