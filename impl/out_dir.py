"""Whether a directory given on the command line can be written, checked before any work.
Imports no torch, so that the report's code, which reads saved files only, need not."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_out_dir(run_dir: str | Path, flag: str = "--out") -> None:
    """Raise ValueError, before any work, when ``run_dir`` cannot become a directory to write
    in: a file stands at it or at one of its parents, or the nearest existing parent is
    read-only, or a directory cannot be made there (tried by making and removing an empty
    one: the permission bits do not bind root, and a pseudo file system such as ``/proc``
    refuses whatever they say). The message names the command-line ``flag`` that gave it."""
    run_dir = Path(run_dir)
    parent = run_dir
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        what = "is a file, not a directory" if parent.is_file() else "is not a directory"
        raise ValueError(f"{flag} {run_dir}: {parent} {what}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {run_dir}: {parent} is not writable")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".pdt-write-check-", dir=parent))
    except OSError as err:
        raise ValueError(
            f"{flag} {run_dir}: cannot write in {parent} ({err.strerror or err})"
        ) from None
