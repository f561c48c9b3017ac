"""Run directories: config first, metrics flushed per epoch, atomic checkpoints, summary last.

Layout (README, "Run directories")::

    config.json      written first
    metrics.jsonl    one JSON line per finished epoch, flushed and fsynced
    checkpoint.pt    the latest end-of-epoch state, written to a temporary file and renamed
    summary.json     written last, with "status": "complete" (or "diverged", where
                     training stopped on non-finite weights or losses)
    .lock            held (flock) by the process training into it, with its pid
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import torch

from impl.messages import first_line
from impl.run_files import (
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    MetricsError,
    read_json,
    read_metrics,
)

CHECKPOINT_FORMAT = "pdtbench-checkpoint-v1"
CHECKPOINT_FILE = "checkpoint.pt"
LOCK_FILE = ".lock"
#: The files a run writes atomically (and the FGSM evaluation's record): the lock clears the
#: temporaries of these only, so a directory that also holds a user's files keeps them.
ATOMIC_FILES = (CONFIG_FILE, METRICS_FILE, CHECKPOINT_FILE, SUMMARY_FILE, "fgsm.json")

#: What each version of ``summary.json`` added that the reports read, or changed in how runs
#: train; a complete run whose summary is older than :data:`SUMMARY_VERSION` lacks a
#: measurement or ran older code, and is trained again by ``pdtbench reproduce``
#: (:func:`outdated_summary`). A summary without the field is 1.
SUMMARY_VERSIONS: dict[int, str] = {
    1: "the first summaries",
    2: "the step phase (optimizer and per-step method work) in the time per iteration",
    3: "Campfire's per-epoch target and step-weighted training FLOPs, PruneTrain's zeroing of "
    "sub-threshold groups and ffcv's ResNet-9 (earlier runs trained or counted these otherwise)",
    4: "PruneTrain's training FLOPs by the authors' cost formula, each metrics row's batch_size "
    "as the batch of its own epoch (it was the next epoch's where the batch grew), SDGP's "
    "semi-structured call counts kept in the checkpoint",
}
SUMMARY_VERSION = max(SUMMARY_VERSIONS)

log = logging.getLogger(__name__)


class RunBusyError(RuntimeError):
    """Another process is training into the run directory right now: ``holder`` is its pid
    (as its lock file records it; "?" where it holds none)."""

    def __init__(self, message: str, holder: str = "?") -> None:
        super().__init__(message)
        self.holder = holder


@contextlib.contextmanager
def locked(
    run_dir: Path,
    busy: str = "wait for it to end, or stop it before --resume",
    doing: str = "trained",
) -> Iterator[None]:
    """Hold an exclusive lock on ``run_dir`` (``flock`` on its ``.lock`` file, which records
    the holder's pid) while training into it, so that a second ``train`` or ``--resume`` of
    the same directory is refused instead of interleaving epochs and overwriting the summary.

    Taking the lock removes the temporary files a writer killed mid-write left (``.NAME.*.tmp``
    of the run's own files, :data:`ATOMIC_FILES`; nothing else in the directory).
    Raises :class:`RunBusyError` naming what the holder is ``doing`` and its pid, then
    ``busy`` (what to do about it). The lock goes with the process (a
    killed run leaves no stale lock). Where the file system has no locks, this warns once and
    runs unlocked.
    """
    import fcntl

    path = Path(run_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise RunBusyError(
                f"{run_dir} is being {doing} by another process (pid {holder}); {busy}", holder
            ) from None
        except OSError as err:  # e.g. ENOLCK on a file system without locks
            log.warning("%s: cannot lock (%s); running without a lock", run_dir, err)
            yield
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        # What a writer killed mid-write left (atomic_write's temporaries, a checkpoint's
        # megabytes): while this lock is held, nothing else writes here.
        for name in ATOMIC_FILES:
            for stale in path.parent.glob(f".{name}.*.tmp"):
                stale.unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def wait_until_free(run_dir: Path) -> None:
    """Block until no process holds ``run_dir``'s lock (:func:`locked`); return at once when
    it has none. For a caller that would rather wait for another process's training of the
    same run (two reproductions sharing runs) than fail."""
    import fcntl

    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # granted once the trainer's exclusive lock is gone
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:  # a file system without locks: nothing to wait on
        pass
    finally:
        os.close(fd)


class CheckpointError(RuntimeError):
    """A checkpoint that is corrupt, truncated, or belongs to another run."""


class StaleRunError(CheckpointError):
    """A killed run of a registered method whose code has changed since its last checkpoint
    (:func:`impl.methods.identity_change`): continuing it would mix two versions of the
    method in one result. ``why`` says what changed."""

    def __init__(self, run_dir: Path, why: str) -> None:
        super().__init__(
            f"{run_dir} cannot be continued: {why}; train it again into another --out "
            "(or remove the directory)"
        )
        self.why = why


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Create or replace ``path`` all at once: ``write(f)`` fills a temporary file in the same
    directory, which is flushed, fsynced and renamed over ``path``. If ``write`` raises (or the
    process is killed), ``path`` keeps its previous content and the temporary file is removed
    (on an exception)."""
    path = Path(path)
    with _naming_the_file(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                # mkstemp makes the file readable by its owner only; the run's files are read
                # by others too (a shared results directory), as a plain open() would make
                # them. A file system without modes (vfat) refuses: it is written all the same.
                with contextlib.suppress(OSError):
                    os.fchmod(f.fileno(), 0o666 & ~_umask())
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


@contextlib.contextmanager
def _naming_the_file(path: Path) -> Iterator[None]:
    """Within the block, an ``OSError`` that names no file (a full disk's ENOSPC from a
    write or fsync) becomes one of the same errno that names ``path``; others pass as
    they are."""
    try:
        yield
    except OSError as err:
        if err.filename is not None:
            raise
        raise OSError(err.errno, f"{err.strerror or err}: writing {path}") from err


def _umask() -> int:
    """The process's file-creation mask, read from /proc where Linux gives it (setting it to
    read it, elsewhere, changes it for a moment for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename
    (:func:`atomic_write`)."""
    atomic_write(path, lambda f: f.write(data))


def outdated_summary(summary: dict[str, Any]) -> str | None:
    """Why a run's summary lacks what the reports now read (its ``summary_version`` is older
    than :data:`SUMMARY_VERSION`), or ``None`` when it is current."""
    version = summary.get("summary_version", 1)
    if not isinstance(version, int) or version >= SUMMARY_VERSION:
        return None
    added = "; ".join(SUMMARY_VERSIONS[v] for v in range(version + 1, SUMMARY_VERSION + 1))
    return f"its summary (version {version}) was written before {added}"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically write ``data`` as indented JSON."""
    atomic_write_bytes(Path(path), (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def complete_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary where it says the run finished (``"status": "complete"``, written
    last); ``None`` where it is missing, unreadable or not complete (killed, or training)."""
    return _summary_with_status(run_dir, "complete")


def diverged_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's record of its divergence (``"status": "diverged"``, written where training
    stopped on non-finite weights or losses, :class:`impl.train.TrainingDiverged`); ``None``
    where the run did not diverge or its summary is missing or unreadable."""
    return _summary_with_status(run_dir, "diverged")


def _summary_with_status(run_dir: Path, status: str) -> dict[str, Any] | None:
    try:
        summary = read_json(Path(run_dir) / SUMMARY_FILE)
    except (OSError, ValueError):
        return None
    return summary if summary.get("status") == status else None


def append_metrics(run_dir: Path, row: dict[str, Any]) -> None:
    """Append one epoch's metrics as a JSON line, flushed and fsynced."""
    path = Path(run_dir) / METRICS_FILE
    with _naming_the_file(path), open(path, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_metrics(run_dir: Path, epochs_done: int) -> None:
    """Keep only the metric lines of epochs before ``epochs_done`` (used on resume: the
    checkpoint has finished that many). Raises :class:`MetricsError`, leaving the file as it
    is, where the lines kept are not those of epochs 0 .. ``epochs_done`` - 1, one each (a
    damaged or edited file: continuing would record a run with epochs missing)."""
    path = Path(run_dir) / METRICS_FILE
    rows = [r for r in read_metrics(run_dir) if r.get("epoch", -1) < epochs_done]
    epochs = [r.get("epoch") for r in rows]
    if epochs != list(range(epochs_done)):
        raise MetricsError(
            f"{path} holds the metrics of epochs {epochs} (0-based), and the checkpoint has "
            f"finished {epochs_done} epoch(s): continuing would record the run without them. "
            f"Restore the file, or train the run again (another --out, or remove {run_dir})"
        )
    data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    atomic_write_bytes(path, data.encode())


def save_checkpoint(run_dir: Path, state: dict[str, Any], config_digest: str) -> None:
    """Atomically save ``state`` (tensors and plain data only) as the run's checkpoint."""
    state = dict(state, format=CHECKPOINT_FORMAT, config_digest=config_digest)
    path = Path(run_dir) / CHECKPOINT_FILE
    try:
        atomic_write(path, lambda f: torch.save(state, f))
    except RuntimeError as err:
        # torch's zip writer reports a failed write (a full disk) so; other errors (a CUDA
        # error met while copying tensors) are not about the file
        if not any(k in str(err) for k in ("inline_container", "PytorchStreamWriter")):
            raise
        raise OSError(
            f"{path}: the checkpoint could not be written ({first_line(err)}; is the disk "
            "full?); the previous checkpoint is kept"
        ) from err


def load_checkpoint(run_dir: Path, config_digest: str | None = None) -> dict[str, Any] | None:
    """Load the run's checkpoint with ``weights_only=True``; ``None`` if there is none.

    Raises :class:`CheckpointError` when the file is corrupt or not a pdtbench checkpoint, or
    when ``config_digest`` is given and the checkpoint belongs to a run of another config.
    """
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError:  # not damage: the file is fine, and must not be removed
        raise
    except Exception as err:  # torch raises several types for a damaged file
        # torch's first line says what failed; the rest of its message advises loading
        # without weights_only, which a damaged file does not need
        first = first_line(err)
        why = "not a file torch saved, or a damaged one"
        if path.stat().st_size == 0:
            why = "the file is empty"
        elif not first.startswith("Weights only load failed"):
            cut = first if len(first) <= 200 else first[:200].rsplit(" ", 1)[0] + " ..."
            why += f": {type(err).__name__}: {cut}"
        raise CheckpointError(
            f"{path}: cannot be read as a checkpoint ({why}); "
            "remove it to train the run again from its first epoch, or train into another "
            "--out"
        ) from err
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not a pdtbench checkpoint (expected {CHECKPOINT_FORMAT})")
    if config_digest is not None and state.get("config_digest") != config_digest:
        raise CheckpointError(
            f"{path}: belongs to another run (config {state.get('config_digest')}, "
            f"this run {config_digest})"
        )
    return state
