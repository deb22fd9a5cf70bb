"""Durable report files: atomic writes, SHA-256 checksums, and the checks `Report.load` makes.

    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "power.csv"
    >>> atomic_write_bytes(path, b"layer\\n0\\n") == sha256_bytes(path.read_bytes())
    True
    >>> verify_file(path, {"size": 8, "sha256": sha256_bytes(b"layer\\n0\\n")}, "power")

Every file of a saved report is written to a temporary sibling, flushed, ``fsync``-ed and then
renamed over its final name, so a crash leaves either the old file or the new one, never half of
one. The manifest (``metadata.json``) records each file's size and SHA-256 and its own checksum
(``manifest_sha256``, over the rest of the manifest); `verify_manifest` and `verify_file` refuse
a damaged or edited report with a :class:`ReportIntegrityError` that names the file and says how
to load it anyway (``Report.load(path, verify=False)``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from ..errors import SpectralHooksError

MANIFEST_CHECKSUM_KEY = "manifest_sha256"
_OPT_OUT = "load it anyway with Report.load(path, verify=False) if you edited it on purpose"


class ReportIntegrityError(SpectralHooksError, ValueError):
    """A saved report is damaged or does not match its manifest (the message says which file)."""


def sha256_bytes(data: bytes) -> str:
    """The SHA-256 of ``data`` as 64 hex digits.

    >>> sha256_bytes(b"")[:8]
    'e3b0c442'
    """
    return hashlib.sha256(data).hexdigest()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:  # no directory fsync on this file system: the rename is atomic regardless
        return
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename); its SHA-256."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, f"cannot save report: cannot write {str(path)!r} "
                                 f"({exc.strerror})") from None
    _fsync_dir(path.parent)
    return sha256_bytes(data)


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the manifest's canonical JSON, without its own checksum key.

    >>> manifest_checksum({"a": 1}) == manifest_checksum({"a": 1, MANIFEST_CHECKSUM_KEY: "x"})
    True
    """
    body = {k: v for k, v in manifest.items() if k != MANIFEST_CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, allow_nan=True, ensure_ascii=False)
    return sha256_bytes(text.encode("utf-8"))


def _require(mapping: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise ReportIntegrityError(f"{where}: the manifest has no {key!r} entry (damaged "
                                   "metadata.json; save the report again)")
    value = mapping[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ReportIntegrityError(f"{where}: manifest entry {key!r} is {value!r}, "
                                   f"expected a {kind.__name__}")
    return value


def check_structure(manifest: Mapping[str, Any], meta_path: Path) -> None:
    """Every key `load_tables` reads is present with the right type (else one clear error)."""
    sections = _require(manifest, "sections", dict, str(meta_path))
    for name, info in sections.items():
        where = f"{meta_path}: section {name!r}"
        _require(info, "file", str, where)
        _require(info, "format", str, where)
        n_rows = _require(info, "n_rows", int, where)
        if n_rows < 0:
            raise ReportIntegrityError(f"{where}: n_rows={n_rows} is negative")
        for i, entry in enumerate(_require(info, "columns", list, where)):
            for key in ("name", "kind", "dtype"):
                _require(entry, key, str, f"{where}, column {i}")


def verify_manifest(manifest: Mapping[str, Any], meta_path: Path) -> None:
    """The manifest's own checksum matches (schema version >= 2)."""
    stored = manifest.get(MANIFEST_CHECKSUM_KEY)
    if not isinstance(stored, str):
        raise ReportIntegrityError(f"{meta_path}: the manifest has no checksum "
                                   f"({MANIFEST_CHECKSUM_KEY!r}); {_OPT_OUT}")
    if stored != manifest_checksum(manifest):
        raise ReportIntegrityError(f"{meta_path}: the manifest was edited or damaged (its "
                                   f"checksum does not match); {_OPT_OUT}")


def verify_file(path: Path, info: Mapping[str, Any], section: str) -> None:
    """The section file has the size and SHA-256 the manifest recorded."""
    where = f"report section {section!r} ({str(path)!r})"
    size, digest = info.get("size"), info.get("sha256")
    if not isinstance(size, int) or not isinstance(digest, str):
        raise ReportIntegrityError(f"{where}: the manifest records no size/sha256; {_OPT_OUT}")
    data = path.read_bytes()
    if len(data) != size:
        raise ReportIntegrityError(f"{where}: the file has {len(data)} bytes, the manifest "
                                   f"says {size} (truncated or appended to); {_OPT_OUT}")
    if sha256_bytes(data) != digest:
        raise ReportIntegrityError(f"{where}: the file's SHA-256 does not match the manifest "
                                   f"(corrupted or edited); {_OPT_OUT}")


def check_shape(raw_rows: int, n_rows: int, section: str, path: Path) -> None:
    """The file holds the number of rows the manifest says (checked even with verify=False).

    >>> try:
    ...     check_shape(2, 3, "power", Path("power.csv"))
    ... except ReportIntegrityError as err:
    ...     print(err)
    report section 'power' ('power.csv'): the file has 2 rows, the manifest says 3
    """
    if raw_rows != n_rows:
        raise ReportIntegrityError(f"report section {section!r} ({str(path)!r}): the file has "
                                   f"{raw_rows} rows, the manifest says {n_rows}")
