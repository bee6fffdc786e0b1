"""Where the project's docs are for the user running hotloop: docs/*.md ship in the wheel as package data of
`hotloop.docs` (pyproject.toml), so the output can cite a file the user has, whether hotloop runs from a checkout
(editable install: the checkout's docs/) or from an installed wheel (site-packages/hotloop/docs/).

`doc_path(name)` -> the Path of docs/<name> as installed; `doc_ref(name)` -> the text to print for it: relative
to the working directory when it lies under it (a checkout: "docs/criteria.md"), else absolute.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

DOCS_PACKAGE = "hotloop.docs"
"""The package whose data are docs/*.md (pyproject.toml's package-dir maps it to docs/; a namespace package: no
module, so its folders are its spec's search locations, not an importlib.resources reader)."""


def doc_path(name: str) -> Path:
    """The installed path of the doc `name` (a file name of docs/, e.g. "nsight.md"). Raises ValueError naming
    `name` when it is not a file name or no such doc is installed (a wheel built without its package data)."""
    if not name or Path(name).name != name:
        raise ValueError(f"doc name {name!r} must be a file name of docs/, e.g. 'criteria.md'")
    spec = find_spec(DOCS_PACKAGE)
    folders = [Path(p) for p in (spec.submodule_search_locations or []) if Path(p).is_dir()] if spec else []
    for folder in folders:
        if (folder / name).is_file():
            return folder / name
    raise ValueError(
        f"doc {name!r} is not installed with hotloop ({DOCS_PACKAGE} holds docs/*.md; "
        f"looked in {', '.join(map(str, folders)) or 'no folder'})"
    )


def doc_ref(name: str, cwd: Path | None = None) -> str:
    """`doc_path(name)` as printed: relative to `cwd` (default: the working directory) when under it, else the
    absolute path. Raises what doc_path raises."""
    path = doc_path(name).resolve()
    here = (cwd or Path(os.getcwd())).resolve()
    return path.relative_to(here).as_posix() if path.is_relative_to(here) else str(path)
