"""An asv configuration that leaves the repository's tracked files as they are.

``asv run`` writes its results, and the list of benchmarks it discovered
(``benchmarks.json``), under ``asv.conf.json``'s ``results_dir``: ``reports/asv/results``,
where the committed GPU history lives. A smoke or CPU check run there rewrites that list with
the scale's own cases. :func:`scratch_config` writes a copy of the configuration whose
results, HTML and environments go to a scratch folder (``.asv/scratch`` by default, ignored
by git), every other setting the same::

    asv --config "$(python -m bench.asv_scratch)" run --python=same --quick

(``make bench-asv-smoke`` runs that at the smoke sizes.) asv reads a configuration's paths
relative to the file, so the copy's are absolute.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Where the scratch configuration and its outputs go unless told (ignored by git: /.asv/).
DEFAULT_SCRATCH = REPO_ROOT / ".asv" / "scratch"
#: The settings of ``asv.conf.json`` that name a path in the repository.
_REPO_PATHS = ("repo", "benchmark_dir")
#: The settings that name where asv writes, and the scratch folder each goes to.
_OUTPUTS = {"results_dir": "results", "html_dir": "html", "env_dir": "env"}


def scratch_settings(conf: dict[str, Any], repo_root: Path, scratch: Path) -> dict[str, Any]:
    """``conf`` (``asv.conf.json``'s settings) with its repository paths made absolute
    against ``repo_root`` and its outputs moved under ``scratch``."""
    out = dict(conf)
    for key in _REPO_PATHS:
        out[key] = str((repo_root / conf.get(key, ".")).resolve())
    for key, name in _OUTPUTS.items():
        out[key] = str((scratch / name).resolve())
    return out


def scratch_config(repo_root: Path = REPO_ROOT, scratch: Path = DEFAULT_SCRATCH) -> Path:
    """Write ``<scratch>/asv.conf.json`` (:func:`scratch_settings` of the repository's
    ``asv.conf.json``) and return its path."""
    conf = json.loads((repo_root / "asv.conf.json").read_text())
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "asv.conf.json"
    path.write_text(json.dumps(scratch_settings(conf, repo_root, scratch), indent=4) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: write the scratch configuration and print its path."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--scratch",
        type=Path,
        default=DEFAULT_SCRATCH,
        help=f"where the configuration and asv's outputs go (default: {DEFAULT_SCRATCH})",
    )
    args = p.parse_args(argv)
    print(scratch_config(REPO_ROOT, args.scratch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
