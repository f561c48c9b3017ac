"""Tests of the run directory's files: what a resume keeps of the metric lines, how damaged
files and failed writes are reported, and who may read what is written."""

from __future__ import annotations

import pytest

from impl import rundir


def test_a_resume_keeps_the_epochs_its_checkpoint_holds_and_drops_the_rest(tmp_path):
    """Killed after epoch 2's metrics were written but before its checkpoint: the checkpoint
    says two epochs (0 and 1) are done, so epoch 2 trains again and its old line must go."""
    for epoch in range(3):
        rundir.append_metrics(tmp_path, {"epoch": epoch, "test_top1": 10.0 * epoch})
    with open(tmp_path / rundir.METRICS_FILE, "a") as f:
        f.write('{"epoch": 3, "test_')  # and a line torn by the kill
    rundir.truncate_metrics(tmp_path, epochs_done=2)
    assert [r["epoch"] for r in rundir.read_metrics(tmp_path)] == [0, 1]
    rundir.truncate_metrics(tmp_path, epochs_done=0)
    assert rundir.read_metrics(tmp_path) == []
    assert (tmp_path / rundir.METRICS_FILE).read_text() == ""


def test_read_metrics_of_a_run_without_metrics_is_empty(tmp_path):
    assert rundir.read_metrics(tmp_path) == []


def test_taking_a_run_directorys_lock_removes_what_a_killed_writer_left(tmp_path):
    # a kill mid-checkpoint left .checkpoint.pt.XXXX.tmp (megabytes) in the run for good
    stale = tmp_path / ".checkpoint.pt.k3j2.tmp"
    stale.write_bytes(b"x" * 100)
    kept = tmp_path / "metrics.jsonl"
    kept.write_text("{}\n")
    users = tmp_path / ".notes.tmp"  # --out may name a directory holding a user's files
    users.write_text("mine")
    with rundir.locked(tmp_path):
        assert not stale.exists()
    assert kept.read_text() == "{}\n" and users.read_text() == "mine"


def test_a_damaged_metrics_line_before_the_last_is_an_error_not_a_silent_cut(tmp_path):
    """Only the last line may be torn (a kill while it was written). A damaged line before
    it used to end the reading there: a resume then rewrote the file without the epochs
    after it and recorded the run's top-1 from an early epoch."""
    import pytest

    for epoch in range(3):
        rundir.append_metrics(tmp_path, {"epoch": epoch, "test_top1": 10.0 * epoch})
    path = tmp_path / rundir.METRICS_FILE
    good = path.read_text()
    path.write_text(good.replace('"epoch": 1,', '"epoch": 1,,'))
    with pytest.raises(rundir.MetricsError, match=r"metrics.jsonl: line 2 of 3 is not JSON"):
        rundir.read_metrics(tmp_path)
    with pytest.raises(rundir.MetricsError):
        rundir.truncate_metrics(tmp_path, epochs_done=3)
    assert "1,," in path.read_text()  # left as it was, for the user to repair
    path.write_text(good.replace('{"epoch": 2', "[2").replace(', "test_top1": 20.0}', "]"))
    with pytest.raises(rundir.MetricsError, match="line 3 is a JSON list, not an object"):
        rundir.read_metrics(tmp_path)
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(rundir.MetricsError, match=r"metrics.jsonl: not a text file"):
        rundir.read_metrics(tmp_path)


def test_a_resume_refuses_metrics_that_miss_an_epoch_of_its_checkpoint(tmp_path):
    import pytest

    for epoch in (0, 2):  # epoch 1's line is gone
        rundir.append_metrics(tmp_path, {"epoch": epoch})
    with pytest.raises(rundir.MetricsError, match=r"epochs \[0, 2\] .* finished 3 epoch"):
        rundir.truncate_metrics(tmp_path, epochs_done=3)
    rundir.truncate_metrics(tmp_path, epochs_done=1)  # what the checkpoint needs is there
    assert [r["epoch"] for r in rundir.read_metrics(tmp_path)] == [0]


def test_read_json_names_the_file_it_cannot_read(tmp_path):
    import pytest

    path = tmp_path / "config.json"
    path.write_text('{"model": "resn')
    with pytest.raises(ValueError, match=f"^{path}: not a JSON file"):
        rundir.read_json(path)
    path.write_text("[]")
    with pytest.raises(ValueError, match=f"^{path}: a JSON list, not an object"):
        rundir.read_json(path)
    rundir.write_json(path, {"a": 1})
    assert rundir.read_json(path) == {"a": 1}


def test_run_files_are_readable_as_the_umask_says(tmp_path):
    """mkstemp made every atomically written file readable by its owner only."""
    import os

    for mask, mode in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        old = os.umask(mask)
        try:
            rundir.write_json(tmp_path / "summary.json", {"a": 1})
            rundir.save_checkpoint(tmp_path, {"epoch": 1}, "digest")
        finally:
            os.umask(old)
        for name in ("summary.json", rundir.CHECKPOINT_FILE):
            assert (tmp_path / name).stat().st_mode & 0o777 == mode, (oct(mask), name)


def test_a_file_system_without_modes_still_gets_its_files(tmp_path, monkeypatch):
    """vfat refuses chmod (EPERM): the file is written all the same, no descriptor left open."""
    import errno
    import os

    def refuse(fd, mode):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "fchmod", refuse)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        rundir.write_json(tmp_path / "summary.json", {"a": 1})
    assert rundir.read_json(tmp_path / "summary.json") == {"a": 1}
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_damaged_checkpoint_says_what_to_do(tmp_path):
    import pytest

    path = tmp_path / rundir.CHECKPOINT_FILE
    cases = [
        (b"", "the file is empty"),
        (b"not a checkpoint\n" * 100, "not a file torch saved, or a damaged one)"),
        (bytes(range(256)) * 4, "not a file torch saved, or a damaged one"),
    ]
    for content, why in cases:
        path.write_bytes(content)
        with pytest.raises(rundir.CheckpointError) as caught:
            rundir.load_checkpoint(tmp_path)
        message = str(caught.value)
        assert why in message and "remove it to train the run again" in message
        assert "weights_only" not in message  # torch's advice does not fit a damaged file


def test_a_checkpoint_read_error_keeps_its_first_line_only(tmp_path, monkeypatch):
    import pytest
    import torch

    (tmp_path / rundir.CHECKPOINT_FILE).write_bytes(b"x" * 64)

    def bad_header(*args, **kwargs):
        raise RuntimeError("bad header\nretry with weights_only=False if you trust the file")

    monkeypatch.setattr(torch, "load", bad_header)
    with pytest.raises(rundir.CheckpointError) as caught:
        rundir.load_checkpoint(tmp_path)
    assert "RuntimeError: bad header)" in str(caught.value)
    assert "weights_only" not in str(caught.value)


def test_a_failed_checkpoint_write_is_an_oserror_naming_it_and_keeps_the_last(
    tmp_path, monkeypatch
):
    """torch reports a write that fails (a full disk) as a RuntimeError; the command line
    shows OSErrors as one line, so it becomes one, naming the file."""
    import pytest
    import torch

    rundir.save_checkpoint(tmp_path, {"epoch": 1}, "digest")

    def full(obj, f, *args, **kwargs):
        raise RuntimeError(
            "[enforce fail at inline_container.cc:672] . unexpected pos 64\nadvice line"
        )

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match=r"checkpoint.pt: the checkpoint could not be written") as e:
        rundir.save_checkpoint(tmp_path, {"epoch": 2}, "digest")
    assert "unexpected pos 64; is the disk full?" in str(e.value)
    assert "advice line" not in str(e.value)  # one line, as the command line shows it
    monkeypatch.undo()
    assert rundir.load_checkpoint(tmp_path)["epoch"] == 1
    assert not list(tmp_path.glob(".*.tmp"))

    def cuda_error(obj, f, *args, **kwargs):  # not about the file: passed on as it is
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch, "save", cuda_error)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        rundir.save_checkpoint(tmp_path, {"epoch": 2}, "digest")


def test_a_write_error_without_a_file_name_gets_the_path(tmp_path, monkeypatch):
    import errno
    import os

    import pytest

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match=r"No space left on device: writing .*summary.json") as full:
        rundir.write_json(tmp_path / "summary.json", {"a": 1})
    assert full.value.errno == errno.ENOSPC  # still a full disk to whoever tells them apart
    with pytest.raises(OSError, match=r"No space left on device: writing .*metrics.jsonl"):
        rundir.append_metrics(tmp_path, {"epoch": 0})


def test_holds_run_knows_a_run_by_its_config_or_its_summary(tmp_path):
    from impl.run_files import holds_run

    assert not holds_run(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    assert not holds_run(tmp_path)
    (tmp_path / "config.json").write_text("{}")  # written first: a run, even a killed one
    assert holds_run(tmp_path)
    other = tmp_path / "other"
    (other / "summary.json").mkdir(parents=True)  # a folder of that name is not the file
    assert not holds_run(other.parent / "other")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "summary.json").write_text("{}")
    assert holds_run(tmp_path / "done")


def test_wait_until_free_blocks_while_a_trainer_holds_the_run(tmp_path):
    """A second reproduction sharing a run waits for the trainer's lock to go (in a blocking
    call, not a busy loop beside the run being timed), and returns at once without one."""
    import threading
    import time

    rundir.wait_until_free(tmp_path)  # no lock file: nothing to wait for
    done = threading.Event()
    with rundir.locked(tmp_path):
        waiter = threading.Thread(
            target=lambda: (rundir.wait_until_free(tmp_path), done.set()), daemon=True
        )
        waiter.start()
        assert not done.wait(0.5)  # still held: still waiting
    assert done.wait(10.0)  # released: it returns
    waiter.join(10.0)
    t0 = time.monotonic()
    rundir.wait_until_free(tmp_path)  # a lock file nobody holds
    assert time.monotonic() - t0 < 5.0


def test_an_unreadable_checkpoint_is_not_called_damaged(tmp_path, monkeypatch):
    """A checkpoint the process may not read is fine on disk: the PermissionError passes on,
    not a CheckpointError telling the user to remove it (or a reproduction to retrain)."""
    import pytest
    import torch

    (tmp_path / rundir.CHECKPOINT_FILE).write_bytes(b"x")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / rundir.CHECKPOINT_FILE))

    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(PermissionError):
        rundir.load_checkpoint(tmp_path)


@pytest.mark.parametrize("seen", [[0, 2, 1], [0, 0, 1], [0, 1, 2, 3]], ids=str)
def test_a_complete_runs_metrics_hold_its_epochs_once_each_in_order(tmp_path, seen):
    """Rows out of order, repeated or past the epochs the run completed are an edited file,
    not the run's curve (a count of rows alone would pass the first two)."""
    from impl.run_files import check_complete_metrics

    with pytest.raises(rundir.MetricsError, match="completed 3 epoch"):
        check_complete_metrics(tmp_path, [{"epoch": e} for e in seen], 3)
    check_complete_metrics(tmp_path, [{"epoch": e} for e in range(3)], 3)  # the run's own


def test_read_json_names_a_file_that_is_not_text(tmp_path):
    from impl.run_files import read_json

    path = tmp_path / "summary.json"
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match="summary.json: not a JSON file"):
        read_json(path)


def test_summary_fields_take_an_int_top1_and_refuse_a_float_seed():
    from impl.run_files import summary_fields_wrong

    summary = dict(method="m", model="r", data="d", scale="cpu", seed=0, epochs=3, top1=90.5)
    assert summary_fields_wrong({**summary, "top1": 90}) == ""
    assert summary_fields_wrong({**summary, "seed": 1.0}) == "seed is 1.0"


def test_the_lock_file_holds_the_holders_pid_alone_and_a_second_taker_is_told_it(tmp_path):
    """The lock file is rewritten with this process's pid, whatever a longer pid of an
    earlier holder left there; a second taking of the lock (another open file: flock is per
    open file) is refused with RunBusyError naming that pid."""
    import os

    (tmp_path / rundir.LOCK_FILE).write_text("123456789012\n")
    with rundir.locked(tmp_path):
        assert (tmp_path / rundir.LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(rundir.RunBusyError, match=rf"pid {os.getpid()}\); wait") as busy:
            with rundir.locked(tmp_path):
                pass
        assert busy.value.holder == str(os.getpid())
    with rundir.locked(tmp_path):  # released at the end of the block
        pass


def test_a_file_system_without_locks_runs_unlocked_with_a_warning(tmp_path, monkeypatch, caplog):
    """flock failing with ENOLCK (an NFS mount without a lock daemon) is not a busy run:
    the block runs, unlocked, after a warning."""
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    ran = []
    with caplog.at_level("WARNING", logger="impl.rundir"), rundir.locked(tmp_path):
        ran.append(True)
    assert ran == [True]
    assert "cannot lock" in caplog.text and "No locks available" in caplog.text


def test_an_interrupted_atomic_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    """Ctrl-C (KeyboardInterrupt, not an Exception) while the new content is written: the
    file keeps its previous content and the temporary file is removed."""
    path = tmp_path / "summary.json"
    rundir.write_json(path, {"a": 1})

    def interrupted(f):
        f.write(b'{"a": ')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rundir.atomic_write(path, interrupted)
    assert rundir.read_json(path) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_torch_file_that_is_not_a_checkpoint_is_refused(tmp_path):
    """A file torch saved, but not by save_checkpoint (no format mark), is not a checkpoint."""
    import torch

    torch.save({"epoch": 2}, tmp_path / rundir.CHECKPOINT_FILE)
    with pytest.raises(rundir.CheckpointError, match="not a pdtbench checkpoint"):
        rundir.load_checkpoint(tmp_path)


def test_a_lock_is_released_at_the_end_of_its_block_though_a_forked_child_lives_on(tmp_path):
    """A child forked while the lock is held (a data-loader worker) shares the lock's open
    file; the end of the block releases the lock all the same, so the run can be taken
    again while the child still runs."""
    import multiprocessing
    import time

    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    try:
        with rundir.locked(tmp_path):
            child.start()
        with rundir.locked(tmp_path):
            assert child.is_alive()
    finally:
        child.terminate()
        child.join(10)


def test_a_file_error_that_names_its_file_passes_as_it_is(tmp_path):
    """An OSError that already names a file (here the temporary file in a directory that
    does not exist) is not rewritten: its file name stays."""
    import errno

    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError) as caught:
        rundir.write_json(missing / "summary.json", {"a": 1})
    assert caught.value.errno == errno.ENOENT
    assert caught.value.filename is not None
    assert caught.value.filename.startswith(str(missing / ".summary.json."))
    assert "writing" not in str(caught.value)


def test_a_summary_is_complete_or_diverged_only_as_its_status_says(tmp_path):
    """complete_summary and diverged_summary each give the summary only for their own
    status, and None for a summary that is missing, not JSON, or of another status."""
    assert rundir.complete_summary(tmp_path) is None
    path = tmp_path / rundir.SUMMARY_FILE
    path.write_text('{"status": "comp')  # not JSON
    assert rundir.complete_summary(tmp_path) is None
    assert rundir.diverged_summary(tmp_path) is None
    rundir.write_json(path, {"status": "diverged", "epoch": 4})
    assert rundir.complete_summary(tmp_path) is None
    assert rundir.diverged_summary(tmp_path) == {"status": "diverged", "epoch": 4}
    rundir.write_json(path, {"top1": 91.0})  # no status: neither
    assert rundir.complete_summary(tmp_path) is None
    assert rundir.diverged_summary(tmp_path) is None
    rundir.write_json(path, {"status": "complete", "top1": 91.0})
    assert rundir.complete_summary(tmp_path) == {"status": "complete", "top1": 91.0}
    assert rundir.diverged_summary(tmp_path) is None


def test_taking_the_lock_removes_the_temporaries_of_each_file_a_run_writes(tmp_path):
    """A kill can interrupt the atomic write of any of the run's own files: the config, the
    metrics (rewritten on resume), the checkpoint, the summary and the FGSM record."""
    names = ("config.json", "metrics.jsonl", "checkpoint.pt", "summary.json", "fgsm.json")
    stale = [tmp_path / f".{name}.a1b2.tmp" for name in names]
    for path in stale:
        path.write_bytes(b"partial")
    with rundir.locked(tmp_path):
        assert [p.name for p in stale if p.exists()] == []


def test_a_lock_held_by_a_process_that_wrote_no_pid_names_an_unknown_holder(tmp_path):
    """Taken but its pid not yet written (or a holder that writes none): refused all the
    same, naming the holder "?"."""
    import fcntl
    import os

    fd = os.open(tmp_path / rundir.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(rundir.RunBusyError, match=r"\(pid \?\)") as busy:
            with rundir.locked(tmp_path):
                pass
        assert busy.value.holder == "?"
    finally:
        os.close(fd)


def test_a_resume_refuses_a_metrics_line_that_names_no_epoch(tmp_path):
    """A line without ``epoch`` among those kept is damage, not a line to drop: the resume
    is refused and the file left as it is."""
    rundir.append_metrics(tmp_path, {"epoch": 0, "test_top1": 10.0})
    rundir.append_metrics(tmp_path, {"test_top1": 20.0})
    rundir.append_metrics(tmp_path, {"epoch": 1, "test_top1": 30.0})
    before = (tmp_path / rundir.METRICS_FILE).read_bytes()
    with pytest.raises(rundir.MetricsError, match="epochs"):
        rundir.truncate_metrics(tmp_path, epochs_done=2)
    assert (tmp_path / rundir.METRICS_FILE).read_bytes() == before


def test_a_long_checkpoint_read_error_is_cut_at_a_word_near_200_characters(tmp_path, monkeypatch):
    """torch's first line, where longer than 200 characters, is cut after the last whole
    word of its first 200 (words ``w000``..: 5 characters each, so ``w039`` ends the cut)."""
    import torch

    (tmp_path / rundir.CHECKPOINT_FILE).write_bytes(b"x" * 64)
    line = " ".join(f"w{i:03d}" for i in range(60))

    def long_error(*args, **kwargs):
        raise RuntimeError(line)

    monkeypatch.setattr(torch, "load", long_error)
    with pytest.raises(rundir.CheckpointError) as caught:
        rundir.load_checkpoint(tmp_path)
    message = str(caught.value)
    assert "RuntimeError: w000 w001" in message
    assert "w038 w039 ...)" in message and "w040" not in message


def test_a_run_without_a_checkpoint_has_none_to_load(tmp_path):
    assert rundir.load_checkpoint(tmp_path) is None
    assert rundir.load_checkpoint(tmp_path, config_digest="abc") is None


def test_a_summary_before_prunetrains_cost_formula_is_outdated_for_it():
    """Version 4 of the summary brought PruneTrain's training FLOPs by the authors' cost
    formula: a version-3 summary lacks it, a version-4 one does not."""
    why = rundir.outdated_summary({"summary_version": 3})
    assert why is not None and why.startswith("its summary (version 3) was written before")
    assert "PruneTrain's training FLOPs by the authors' cost formula" in why
    assert "the step phase" not in why  # version 2's change it already has
    later = rundir.outdated_summary({"summary_version": 4}) or ""
    assert "PruneTrain's training FLOPs by the authors' cost formula" not in later


def test_a_summary_version_that_is_not_an_integer_is_not_called_outdated():
    """A hand-edited or foreign ``summary_version`` (text, None) is not compared: the run is
    not trained again for it, and reading it does not fail."""
    assert rundir.outdated_summary({"summary_version": "2"}) is None
    assert rundir.outdated_summary({"summary_version": None}) is None


def test_a_stale_run_says_to_train_it_again_elsewhere(tmp_path):
    err = rundir.StaleRunError(tmp_path, "m:M has changed since it was trained")
    assert isinstance(err, rundir.CheckpointError) and err.why.startswith("m:M has changed")
    assert str(err) == (
        f"{tmp_path} cannot be continued: m:M has changed since it was trained; train it "
        "again into another --out (or remove the directory)"
    )


@pytest.mark.parametrize(
    "seen, held",
    [([0, 1, 2], "3 row(s), epochs 0 to 2"), ([], "0 row(s)"), ([1, 3], "2 row(s), epochs 1 to 3")],
    ids=str,
)
def test_a_complete_runs_short_metrics_are_named_by_their_count_and_first_and_last_epoch(
    tmp_path, seen, held
):
    """A run whose summary says 4 epochs, and a metrics file that holds fewer: the message
    names how many rows there are and the first and last epoch they hold."""
    from impl.run_files import check_complete_metrics

    with pytest.raises(rundir.MetricsError) as caught:
        check_complete_metrics(tmp_path, [{"epoch": e} for e in seen], 4)
    assert f"completed 4 epoch(s), the file holds {held}: it was cut short" in str(caught.value)


def test_a_summary_edited_by_hand_is_told_each_missing_field_and_each_wrong_type():
    """Every field the runs table reads is required; a field that is there but null, or a
    JSON true where a number goes, is named with its value, not called missing."""
    from impl.run_files import summary_fields_wrong

    assert summary_fields_wrong({}) == "it lacks method, model, data, scale, seed, epochs, top1"
    edited = dict(method="sdgp", model="resnet20", data="cifar10", seed=True, epochs=3, top1=None)
    assert summary_fields_wrong(edited) == "it lacks scale; seed is True; top1 is None"
    assert summary_fields_wrong({**edited, "scale": "cpu", "seed": 0, "top1": 91}) == ""


def test_a_summary_of_the_current_version_is_not_outdated_and_an_old_one_lists_each_later_change():
    """A summary written now (version SUMMARY_VERSION) is current; one without the field is
    version 1 and lacks what versions 2 to SUMMARY_VERSION added, and no more; the version
    before the current one lacks only the current one's."""
    now = rundir.SUMMARY_VERSION
    assert now >= 2 and set(rundir.SUMMARY_VERSIONS) == set(range(1, now + 1))
    assert rundir.outdated_summary({"summary_version": now}) is None
    assert rundir.outdated_summary({"summary_version": now + 1}) is None
    first = rundir.outdated_summary({"status": "complete"})
    assert first is not None and first.startswith("its summary (version 1) was written before")
    assert rundir.SUMMARY_VERSIONS[1] not in first  # what version 1 had is not missing
    for version in range(2, now + 1):
        assert rundir.SUMMARY_VERSIONS[version] in first
    last = rundir.outdated_summary({"summary_version": now - 1})
    assert last == (
        f"its summary (version {now - 1}) was written before {rundir.SUMMARY_VERSIONS[now]}"
    )


def test_a_runs_json_files_are_written_with_sorted_keys_summary_indented_metrics_a_line_each(
    tmp_path,
):
    """summary.json and config.json are read by people: indented by two spaces, keys in
    order; each metrics line is one object on one line, keys in order."""
    rundir.write_json(tmp_path / rundir.SUMMARY_FILE, {"top1": 91.5, "status": "complete"})
    assert (tmp_path / rundir.SUMMARY_FILE).read_text() == (
        '{\n  "status": "complete",\n  "top1": 91.5\n}\n'
    )
    rundir.append_metrics(tmp_path, {"test_top1": 10.0, "epoch": 0})
    rundir.append_metrics(tmp_path, {"loss": 2.5, "epoch": 1})
    assert (tmp_path / rundir.METRICS_FILE).read_text() == (
        '{"epoch": 0, "test_top1": 10.0}\n{"epoch": 1, "loss": 2.5}\n'
    )


def test_a_checkpoint_is_read_back_by_its_own_config_and_refused_by_another(tmp_path):
    import torch

    rundir.save_checkpoint(tmp_path, {"epoch": 2, "w": torch.ones(2)}, config_digest="abc")
    state = rundir.load_checkpoint(tmp_path, config_digest="abc")
    assert state is not None and state["epoch"] == 2 and state["w"].tolist() == [1.0, 1.0]
    assert state["config_digest"] == "abc" and state["format"] == rundir.CHECKPOINT_FORMAT
    with pytest.raises(rundir.CheckpointError, match=r"another run \(config abc, this run xyz\)"):
        rundir.load_checkpoint(tmp_path, config_digest="xyz")
