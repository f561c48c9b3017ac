"""impl.distributed in one process: sharding, environment, launch command, batch norm, no-ops."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from impl import distributed as D

ACTIVE = D.DistInfo(rank=1, world_size=2, local_rank=1, backend="gloo", timeout_s=30.0)


@pytest.mark.parametrize(
    "n,world",
    [(0, 2), (1, 2), (9, 2), (33, 2), (32, 4), (7, 3), (128, 5), (5, 8)],
    ids=lambda v: str(v),
)
def test_shard_bounds_split_like_tensor_split(n, world):
    parts = torch.tensor_split(torch.arange(n), world)
    stop_prev = 0
    for rank in range(world):
        start, stop = D.shard_bounds(n, rank, world)
        assert start == stop_prev
        assert torch.equal(torch.arange(start, stop), parts[rank])
        stop_prev = stop
    assert stop_prev == n
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_shard_bounds_rejects_bad_ranks():
    with pytest.raises(ValueError, match="outside world_size 2"):
        D.shard_bounds(10, 2, 2)
    with pytest.raises(ValueError, match="n must be >= 0"):
        D.shard_bounds(-1, 0, 1)


def test_shard_takes_this_ranks_share():
    x = torch.arange(9.0).view(9, 1)
    y = torch.arange(9)
    xs, ys = D.shard(x, y, ACTIVE)
    assert torch.equal(ys, torch.arange(5, 9)) and torch.equal(xs[:, 0], ys.float())
    assert D.shard(x, y, D.DistInfo())[0] is x


def test_data_parallel_shard_takes_a_loaders_share_as_it_is():
    dp = D.DataParallel(ACTIVE, torch.device("cpu"), timing=False)
    x, y = torch.arange(9.0).view(9, 1), torch.arange(9)
    xs, ys = dp.shard(x, y)  # a whole global batch: sliced
    assert torch.equal(ys, torch.arange(5, 9)) and (dp._n_local, dp._n_global) == (4, 9)
    xs, ys = dp.shard(x[5:], y[5:], n_global=9)  # already the share: kept
    assert torch.equal(ys, torch.arange(5, 9)) and (dp._n_local, dp._n_global) == (4, 9)
    with pytest.raises(ValueError, match="exceeds its batch 3"):
        dp.shard(x, y, n_global=3)


def test_timeout_seconds(monkeypatch):
    monkeypatch.delenv(D.TIMEOUT_ENV, raising=False)
    assert D.timeout_seconds() == D.DEFAULT_TIMEOUT_S
    assert D.timeout_seconds(2.5) == 2.5
    monkeypatch.setenv(D.TIMEOUT_ENV, "7")
    assert D.timeout_seconds() == 7.0
    monkeypatch.setenv(D.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="number of seconds"):
        D.timeout_seconds()
    with pytest.raises(ValueError, match="> 0 seconds"):
        D.timeout_seconds(0)


def test_env_world(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert D.env_world() is None
    assert D.init_from_env("cpu") == D.DistInfo()  # no torchrun: one process, no group
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert D.env_world() == (3, 4, 1)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="outside WORLD_SIZE=4"):
        D.env_world()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="integers"):
        D.env_world()


def test_backend_and_device_choice():
    assert D.backend_for("cpu") == "gloo"
    assert D.backend_for("cuda:1") == "nccl"
    assert D.backend_for("auto") == ("nccl" if torch.cuda.is_available() else "gloo")
    cpu = torch.device("cpu")
    assert D.rank_device(cpu, ACTIVE) == cpu
    assert D.rank_device(torch.device("cuda", 0), ACTIVE) == torch.device("cuda", 0)
    assert D.rank_device(torch.device("cuda"), D.DistInfo()) == torch.device("cuda")


def test_each_nccl_rank_has_a_gpu_of_its_own(monkeypatch):
    # Under a user's torchrun, --device cuda:3 put every rank on GPU 3 (init_process_group had
    # selected each local rank's), and pdtbench's --nproc 16 on 8 GPUs put two on each: NCCL
    # fails both after start-up, with a duplicate-GPU error. Each is now refused with its
    # reason. (A worker does not refuse a local rank past its GPUs: a scheduler may give each
    # process a GPU of its own, which it sees as GPU 0.)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    nccl = D.DistInfo(rank=9, world_size=16, local_rank=1, backend="nccl", timeout_s=30.0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert D.rank_device(torch.device("cuda"), nccl) == torch.device("cuda", 1)
    assert D.rank_device(torch.device("cuda", 1), nccl) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="--device cuda:3 on local rank 1, whose GPU is cuda:1"):
        D.rank_device(torch.device("cuda", 3), nccl)
    # one process per node may name its GPU (several nodes, each told to use GPU 3)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    alone = D.DistInfo(rank=1, world_size=2, local_rank=0, backend="nccl", timeout_s=30.0)
    assert D.rank_device(torch.device("cuda", 3), alone) == torch.device("cuda", 3)
    assert D.gpu_shortage(8, "cuda") is None and D.gpu_shortage(16, "cpu") is None
    assert "16 processes on this node need a CUDA GPU each" in D.gpu_shortage(16, "auto")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # one GPU a process
    assert D.rank_device(torch.device("cuda"), nccl) == torch.device("cuda", 0)


def test_torchrun_command_passes_our_flags_untouched():
    cmd = D.torchrun_command(["train", "--nproc", "2", "--r", "3"], 2)
    assert cmd[1:4] == ["-m", "impl.launch_agent", "--nproc-per-node=2"]
    assert "--standalone" in cmd
    i = cmd.index("impl.cli")
    assert cmd[i - 1] == "-m" and cmd[i + 1] == "--"
    assert cmd[i + 2 :] == ["train", "--nproc", "2", "--r", "3"]
    pinned = D.torchrun_command(["x"], 3, module="m", port=29555)
    assert "--master-port=29555" in pinned and "--standalone" not in pinned
    with pytest.raises(ValueError, match="nproc must be an int >= 1"):
        D.torchrun_command([], 0)


def test_describe_failure_names_rank_and_cause():
    msg = D.describe_failure(RuntimeError("[gloo] Connection closed by peer"), ACTIVE)
    assert msg.startswith(
        "distributed training stopped on rank 1 of 2 because a peer process exited or hung"
    )
    assert "30 s timeout" in msg
    plain = D.describe_failure(ValueError("bad option\nmore"), ACTIVE)
    assert plain == "distributed training failed on rank 1 of 2: ValueError: bad option"


def test_comm_masks_protocol():
    keep = {"w": torch.ones(2, dtype=torch.bool)}
    other = {"v": torch.zeros(2, dtype=torch.bool)}
    ctx = types.SimpleNamespace(extra={"comm_masks": other})
    with_hook = types.SimpleNamespace(comm_masks=lambda c: keep)
    declining = types.SimpleNamespace(comm_masks=lambda c: None)
    assert D.comm_masks(ctx, with_hook) is keep
    assert D.comm_masks(ctx, declining) is other
    assert D.comm_masks(ctx, object()) is other
    assert D.comm_masks(types.SimpleNamespace(extra={}), None) is None


def bn_model() -> nn.Module:
    torch.manual_seed(2)
    return nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.BatchNorm2d(3))


def test_sync_batchnorm_keeps_types_and_state_and_undoes():
    m = bn_model()
    keys = list(m.state_dict())
    assert D.sync_batchnorm(m) == 2
    assert D.sync_batchnorm(m) == 0  # idempotent
    assert type(m[1]) is nn.BatchNorm2d and list(m.state_dict()) == keys
    x = torch.randn(4, 2, 6, 6)
    ref = bn_model()
    assert torch.equal(m(x), ref(x))  # no process group: the module's own forward
    assert D.unsync_batchnorm(m) == 2
    assert "forward" not in m[1].__dict__


@pytest.fixture
def one_rank_group(tmp_path):
    assert not dist.is_initialized()
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("momentum", [0.1, None], ids=["ema", "cumulative"])
def test_global_batchnorm_math_equals_native(one_rank_group, monkeypatch, momentum):
    """The CPU path of the global statistics, run on one rank that pretends to be one of
    two (its all-reduces are then identities): output, gradients and running statistics
    equal torch's batch norm."""
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 3, 7, 7, generator=g) * 3 + 1
    ours, ref = nn.BatchNorm2d(3, momentum=momentum), nn.BatchNorm2d(3, momentum=momentum)
    for bn in (ours, ref):
        with torch.no_grad():
            bn.weight.copy_(torch.tensor([0.5, 1.5, -1.0]))
            bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    stats = D.comm.CommStats()
    D.sync_batchnorm(ours, stats)
    xa = x.clone().requires_grad_()
    xb = x.clone().requires_grad_()
    w = torch.randn(5, 3, 7, 7, generator=g)
    for _ in range(2):
        (ours(xa) * w).sum().backward()
        (ref(xb) * w).sum().backward()
    assert torch.allclose(ours(xa), ref(xb), atol=1e-5)
    assert torch.allclose(xa.grad, xb.grad, atol=1e-5)
    assert torch.allclose(ours.weight.grad, ref.weight.grad, atol=1e-4)
    assert torch.allclose(ours.bias.grad, ref.bias.grad, atol=1e-4)
    assert torch.allclose(ours.running_mean, ref.running_mean, atol=1e-6)
    assert torch.allclose(ours.running_var, ref.running_var, atol=1e-5)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 3
    stats.end_iteration()
    assert stats.aux_bytes[0] > 0  # the statistics' all-reduces are counted
    ours.eval()
    ref.eval()
    assert torch.allclose(ours(x), ref(x), atol=1e-5)  # eval: running statistics


def test_global_loss_is_the_global_value_bit_for_bit_with_the_local_gradient(one_rank_group):
    """Every rank must see the same loss value (the methods decide from it): the value is
    the all-reduced global mean exactly, whatever this rank's own mean; the gradient is the
    local one. (A world of one stands in for rank 0 of two: its all-reduce is the identity,
    3 of 7 samples its share.)"""
    dp = D.DataParallel(D.DistInfo(world_size=2, backend="gloo"), torch.device("cpu"), False)
    x, y = torch.randn(3, 2), torch.arange(3)
    dp.shard(x, y, n_global=7)
    # a local mean whose float32 round trip local + (value - local) is not value
    w = torch.tensor(0.9222684502601624, requires_grad=True)
    local = w * 1.0
    loss = dp.global_loss(local, x)
    assert loss.item() == (torch.tensor(w.item()).double() * 3 / 7).float().item()
    loss.backward()
    assert w.grad.item() == 1.0


def test_data_parallel_is_a_no_op_for_one_process():
    m = nn.Linear(3, 2)
    dp = D.DataParallel(D.DistInfo(), torch.device("cpu"), timing=False)
    ctx = types.SimpleNamespace(model=m, extra={})
    dp.prepare(ctx)
    assert dp.module(ctx) is m and not dp.active and dp.is_main
    x, y = torch.randn(5, 3), torch.arange(5)
    assert dp.shard(x, y)[0] is x
    local = F.cross_entropy(m(x), y % 2)
    assert dp.global_loss(local, m(x)) is local
    total = local * 2
    assert dp.backward_loss(total, local) is total  # one process: the loss as it is
    assert dp.reduce([1, 2.5]) == [1.0, 2.5]
    assert dp.broadcast_flag(True) is True and dp.broadcast_int(5) == 5
    dp.end_iteration(ctx)
    keep = torch.zeros(2, 3, dtype=torch.bool)
    keep[0, 0] = True
    ctx.extra["comm_masks"] = {"weight": keep}
    dp.refresh(ctx)
    dp.end_iteration(ctx)
    row = dp.epoch_metrics(ctx)
    # one dense iteration (8 floats), one with the mask (1 weight + 2 biases)
    assert row["comm_bytes_per_iter"] == (8 * 4 + 3 * 4) / 2
    assert row["comm_bytes_source"] == "computed" and row["world_size"] == 1
    assert row["comm_sparse_iters"] == 1 and "comm_ms" not in row
    summary = dp.summary(row, ctx)
    assert summary["world_size"] == 1 and summary["global_batchnorm"] is False
    assert D.run_worker(lambda: 42) == 42  # no torchrun: just runs


def test_init_process_group_and_current_report_the_group(tmp_path):
    info = D.init_process_group(
        0, 1, device="cpu", init_method=f"file://{tmp_path / 'store'}", timeout_s=12
    )
    try:
        assert info == D.DistInfo(0, 1, 0, "gloo", 12.0)
        assert D.current() == info and not info.active
    finally:
        D.shutdown()
    assert not dist.is_initialized() and D.current() == D.DistInfo()
    with pytest.raises(ValueError, match="outside world_size 1"):
        D.init_process_group(1, 1)


SLEEPER = """import os, time
pid_file = os.path.join(os.environ["SLEEPER_DIR"], "rank%s.pid" % os.environ["RANK"])
open(pid_file + ".tmp", "w").write(str(os.getpid()))
os.replace(pid_file + ".tmp", pid_file)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _worker_pids(proc: subprocess.Popen, tmp_path) -> list[int]:
    """The pids the two workers of ``proc``'s job wrote into ``tmp_path`` (rank0.pid,
    rank1.pid), once both have; fails when ``proc`` ends first or after 120 s."""
    pid_files = [tmp_path / f"rank{r}.pid" for r in (0, 1)]
    deadline = time.monotonic() + 120
    while not all(f.exists() for f in pid_files):
        assert time.monotonic() < deadline and proc.poll() is None, "no workers started"
        time.sleep(0.2)
    return [int(f.read_text()) for f in pid_files]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.slow
def test_a_job_stops_when_the_process_that_launched_it_is_killed(tmp_path):
    """SIGKILL of `pdtbench train --nproc N` (the launching process) ends torchrun and its
    workers: they no longer train on with nobody to report to (or to resume them)."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    env = dict(os.environ, SLEEPER_DIR=str(tmp_path), PYTHONPATH=str(tmp_path))
    code = "from impl.distributed import launch; launch(['x'], 2, module='sleeper', threads=1)"
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.DEVNULL)
    try:
        workers = _worker_pids(parent, tmp_path)
        assert all(_alive(w) for w in workers)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [w for w in workers if _alive(w)]
    for w in left:
        os.kill(w, 9)
    assert not left, "workers outlived the killed launcher"


# A worker as impl.cli makes one: SIGTERM raises a KeyboardInterrupt whose exit_code is 143
STOPPABLE = """import os, signal, time
from impl.distributed import run_worker


class Terminated(KeyboardInterrupt):
    exit_code = 143


def stop(signum, frame):
    raise Terminated()


signal.signal(signal.SIGTERM, stop)


def wait():
    pid_file = os.path.join(os.environ["SLEEPER_DIR"], "rank%s.pid" % os.environ["RANK"])
    open(pid_file + ".tmp", "w").write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)
    time.sleep(120)


run_worker(wait, "cpu", prog="stoppable")
"""


def _stop_when_workers_run(proc: subprocess.Popen, tmp_path, stop) -> tuple[int, str]:
    """Wait until both workers of ``proc``'s job have written their pid files, call ``stop``,
    and return the job's exit status and standard error (workers left running are killed)."""
    try:
        workers = _worker_pids(proc, tmp_path)
        stop()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # say what the stuck process was doing
            masks = [line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                     if line.startswith(("SigBlk", "SigIgn", "SigCgt", "State"))]  # fmt: skip
            os.killpg(proc.pid, 9)
            _, err = proc.communicate()
            raise AssertionError(f"not stopped within 60 s ({'; '.join(masks)}): {err}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    left = [w for w in workers if _alive(w)]
    for w in left:
        os.kill(w, 9)
    assert not left, "workers outlived the stopped job"
    return proc.returncode, err


@pytest.mark.parametrize("who", ["launcher", "group"])
@pytest.mark.slow
def test_a_launched_job_stopped_by_ctrl_c_ends_without_a_traceback(tmp_path, who):
    """Ctrl-C of `pdtbench train --nproc N` stops the job with SIGTERM: the agent and the
    workers used to print three tracebacks ("distributed training failed on rank 0 of 2:
    Terminated", torchrun's SignalException) under the launcher's one line; they now end
    quietly, the launcher's caller saying what was kept."""
    import signal

    (tmp_path / "stoppable.py").write_text(STOPPABLE)
    env = dict(os.environ, SLEEPER_DIR=str(tmp_path), PYTHONPATH=str(tmp_path))
    env.pop(D.LAUNCHED_ENV, None)
    # a terminal's process: SIGINT handled and not blocked, whatever the test runner's
    # process passed on (an ignored or blocked signal is inherited across exec)
    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"
        "from impl.distributed import launch\ntry:\n"
        "    sys.exit(launch(['x'], 2, module='stoppable', threads=1))\n"
        "except KeyboardInterrupt:\n    print('launcher: interrupted', file=sys.stderr)\n"
        "    sys.exit(130)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, for the clean-up of a failed test
    )
    # a terminal's Ctrl-C reaches the whole process group: torchrun's agent then also logged
    # "Received 2 death signal, shutting down workers" and a "closing signal" line per worker
    stop = (lambda: parent.send_signal(signal.SIGINT)) if who == "launcher" else (
        lambda: os.killpg(parent.pid, signal.SIGINT))  # fmt: skip
    status, err = _stop_when_workers_run(parent, tmp_path, stop)
    assert status == 130, err
    assert "Traceback" not in err and "stopped" not in err and "error" not in err, err
    assert "death signal" not in err and "closing signal" not in err, err
    assert err.rstrip().endswith("launcher: interrupted"), err


@pytest.mark.slow
def test_workers_of_a_torchrun_of_ones_own_stopped_by_sigterm_say_so_in_one_line(tmp_path):
    """Outside `pdtbench train --nproc`, a worker stopped by a signal names its rank in one
    line and exits 143 (it printed a traceback and "failed", status 3); the agent, as
    launch_agent runs it, exits 143 as well, without its traceback."""
    import signal

    (tmp_path / "stoppable.py").write_text(STOPPABLE)
    env = dict(os.environ, SLEEPER_DIR=str(tmp_path), PYTHONPATH=str(tmp_path))
    env.pop(D.LAUNCHED_ENV, None)
    agent = subprocess.Popen(
        D.torchrun_command(["x"], 2, module="stoppable", port=D.free_port()),
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    status, err = _stop_when_workers_run(
        agent, tmp_path, lambda: os.killpg(agent.pid, signal.SIGTERM)
    )
    assert status == 143, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("stoppable:")]
    assert sorted(lines) == [
        "stoppable: stopped (SIGTERM) on rank 0 of 2",
        "stoppable: stopped (SIGTERM) on rank 1 of 2",
    ], err


FAILING = """import os, time
from impl.distributed import run_worker


def work():
    if os.environ["RANK"] == "1":
        raise ValueError("boom on purpose")
    time.sleep(120)


run_worker(work, "cpu", prog="failing")
"""


def _launch_worker_module(tmp_path, name: str, source: str) -> subprocess.CompletedProcess:
    """Run ``source`` as module ``name`` on 2 ranks through :func:`impl.distributed.launch`."""
    (tmp_path / f"{name}.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    code = (
        "import sys\nfrom impl.distributed import launch\n"
        f"sys.exit(launch(['x'], 2, module={name!r}, threads=1))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180
    )


@pytest.mark.slow
def test_a_failed_worker_is_reported_once_by_itself_and_in_one_line_by_the_agent(tmp_path):
    """The worker's traceback and its line name the error; torchrun's agent added a second
    traceback and a table of every rank (ChildFailedError) that buried it."""
    proc = _launch_worker_module(tmp_path, "failing", FAILING)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert err.count("Traceback") == 1 and "ValueError: boom on purpose" in err, err
    assert "failing: error: distributed training failed on rank 1 of 2" in err, err
    assert "ChildFailedError" not in err, err
    assert err.rstrip().splitlines()[-1] == (
        "torchrun: rank 1 failed first (exit status 3) and the other ranks were stopped; "
        "what the rank printed is above"
    )


FAILING_BESIDE_A_COLLECTIVE = """import os
import torch
import torch.distributed as dist
from impl.distributed import run_worker


def work():
    x = torch.ones(1)
    dist.all_reduce(x)
    if os.environ["RANK"] == "1":
        raise ValueError("boom beside a collective")
    while True:  # rank 0's next collective finds rank 1 gone
        dist.all_reduce(x)


run_worker(work, "cpu", prog="failing")
"""


@pytest.mark.slow
def test_the_agent_names_the_rank_that_raised_not_the_survivor(tmp_path):
    """The survivor's collective fails as soon as the rank that raised exits, and torchrun's
    own "first failure" (timestamps in whole seconds, ties to rank 0) named the survivor."""
    proc = _launch_worker_module(tmp_path, "failing", FAILING_BESIDE_A_COLLECTIVE)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert "failing: error: distributed training failed on rank 1 of 2: ValueError" in err, err
    assert err.rstrip().splitlines()[-1] == (
        "torchrun: rank 1 failed first (exit status 3) and the other ranks were stopped; "
        "what the rank printed is above"
    ), err


def test_the_rank_named_is_the_cause_before_its_consequences():
    from types import SimpleNamespace as F

    from impl.distributed import EXIT_DIST_FAILURE, EXIT_PEER_STOPPED
    from impl.launch_agent import first_failure

    raised = F(exitcode=EXIT_DIST_FAILURE, timestamp=100)
    survivor = F(exitcode=EXIT_PEER_STOPPED, timestamp=100)
    assert first_failure({0: survivor, 1: raised}) == (1, raised)
    stopped = F(exitcode=-15, timestamp=99)  # SIGTERM: how the agent stops the others
    assert first_failure({0: stopped, 1: raised}) == (1, raised)
    # a pdtbench worker turns SIGTERM into an exception and exits 143, as a shell reports it
    assert first_failure({0: F(exitcode=143, timestamp=100), 1: raised}) == (1, raised)
    killed = F(exitcode=-9, timestamp=101)  # out of memory: the cause, though later
    assert first_failure({0: survivor, 1: killed, 2: stopped}) == (1, killed)
    early = F(exitcode=EXIT_PEER_STOPPED, timestamp=99)
    assert first_failure({0: survivor, 1: early}) == (1, early)  # all stopped by peers
    assert first_failure({1: raised, 0: F(exitcode=3, timestamp=100)})[0] == 0  # tie: rank 0


AGREED_FAILURE = """from impl.distributed import run_worker


class Found(RuntimeError):
    same_on_every_rank = True  # as TrainingDiverged: every rank finds it at one step


def work():
    raise Found("training diverged on purpose")


run_worker(work, "cpu", prog="agreed")
"""


@pytest.mark.slow
def test_a_failure_every_rank_finds_is_reported_once_without_a_traceback(tmp_path):
    """A diverged run stops every rank at the same step: one line says so, from rank 0, not
    a traceback and a line per rank."""
    proc = _launch_worker_module(tmp_path, "agreed", AGREED_FAILURE)
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr
    assert "Traceback" not in err, err
    assert err.count("training diverged on purpose") == 1, err
    assert "agreed: error: training diverged on purpose" in err, err


def test_how_a_worker_ended_in_words():
    from impl.launch_agent import how_it_ended

    assert how_it_ended(3) == "exit status 3"
    assert how_it_ended(4) == "exit status 4: stopped because a peer failed"
    assert how_it_ended(143) == "exit status 143: stopped by SIGTERM"
    assert how_it_ended(-15) == "killed by SIGTERM"
    assert how_it_ended(-9) == "killed by SIGKILL: out of memory, most often"
    assert how_it_ended(-200) == "killed by signal 200"


def test_sync_bn_aux_bytes_counts_the_gather_and_the_reduce():
    # forward gathers world * (2C + 1) statistics, backward all-reduces 2C sums; half inputs
    # have float32 statistics (the count was twice the gather, in the input's dtype)
    x = torch.empty(4, 16, 2, 2)
    assert D.sync_bn_aux_bytes(x, 8) == (8 * 33 + 32) * 4
    assert D.sync_bn_aux_bytes(x.half(), 8) == (8 * 33 + 32) * 4
    assert D.sync_bn_aux_bytes(x.bfloat16(), 2) == (2 * 33 + 32) * 4
    assert D.sync_bn_aux_bytes(x.double(), 2) == (2 * 33 + 32) * 8


def test_a_line_to_standard_error_is_one_write_with_its_newline(capfd, monkeypatch):
    writes: list[bytes] = []
    real_write = os.write

    def recording_write(fd, data):
        writes.append(data)
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", recording_write)
    D.write_stderr_line("rank 1: stopped")
    monkeypatch.undo()
    assert writes == [b"rank 1: stopped\n"]  # text and newline together, never apart
    assert capfd.readouterr().err == "rank 1: stopped\n"


def test_a_line_to_a_captured_standard_error_is_written_as_text(monkeypatch):
    import io

    stream = io.StringIO()  # no file descriptor
    monkeypatch.setattr(sys, "stderr", stream)
    D.write_stderr_line("rank 0: error")
    assert stream.getvalue() == "rank 0: error\n"


def test_launch_gives_each_worker_its_share_of_the_cores(monkeypatch):
    """OMP_NUM_THREADS of the workers: ``threads`` where given; else, on a CPU-only machine
    without one set, the cores shared out (8 cores, 2 workers: 4 each), so N workers do not
    run N times the machine's threads."""
    seen = []

    class Job:
        def __init__(self, cmd, env=None, **kwargs):
            seen.append(env)

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Job)
    monkeypatch.setattr(D.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(D.torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert D.launch(["x"], 2) == 0
    assert D.launch(["x"], 2, threads=3) == 0
    assert D.launch(["x"], 3, env={"OMP_NUM_THREADS": "5"}) == 0  # one already set is kept
    assert [e["OMP_NUM_THREADS"] for e in seen] == ["4", "3", "5"]
    assert all(e[D.LAUNCHED_ENV] == "1" for e in seen)


def test_sum_over_ranks_reduces_in_float64_for_the_job_it_is_given(monkeypatch):
    """The explicit job is used (not the process's, here inactive), and the sums travel as
    float64: a count past 2^24 and a fraction keep their digits."""
    seen = []

    def fake_all_reduce(t):
        seen.append(t.dtype)
        t += t  # two ranks holding the same values

    monkeypatch.setattr(D.dist, "all_reduce", fake_all_reduce)
    monkeypatch.setattr(D, "current", lambda: D.DistInfo())  # inactive
    job = D.DistInfo(0, 2, 0, "gloo", 60.0)
    assert D.sum_over_ranks([2**24 + 1, 0.1], job) == [2 * (2**24 + 1), 0.2]
    assert seen == [torch.float64]
    assert D.sum_over_ranks([3.0]) == [3.0] and seen == [torch.float64]  # no job: no reduce
