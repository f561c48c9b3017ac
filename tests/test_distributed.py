"""impl.distributed in one process: sharding, environment, launch command, batch norm, no-ops."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

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


@pytest.fixture
def no_torchrun_env(monkeypatch):
    """No torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK) in the environment."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)


def test_env_world(monkeypatch, no_torchrun_env):
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


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0], ids=["inf", "nan", "neg"])
def test_timeout_seconds_refuses_an_infinite_or_undefined_timeout(monkeypatch, bad):
    """A timeout must be a finite positive number, given or read from the environment."""
    with pytest.raises(ValueError, match="> 0 seconds"):
        D.timeout_seconds(bad)
    monkeypatch.setenv(D.TIMEOUT_ENV, str(bad))
    with pytest.raises(ValueError, match="> 0 seconds"):
        D.timeout_seconds()


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"RANK": "1"}, None),  # no WORLD_SIZE: not a torchrun worker
        ({"WORLD_SIZE": "2"}, None),  # no RANK
        ({"RANK": "2", "WORLD_SIZE": "3"}, (2, 3, 2)),  # no LOCAL_RANK: one node, the rank
        ({"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0"}, (2, 3, 0)),
    ],
    ids=["rank-only", "world-only", "local-from-rank", "local-given"],
)
def test_env_world_needs_both_rank_and_world_size(monkeypatch, no_torchrun_env, env, expected):
    """Both RANK and WORLD_SIZE make a torchrun worker; LOCAL_RANK defaults to the rank."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert D.env_world() == expected


class _FakeGroup:
    """Records the calls init_process_group makes of torch.distributed (no real group)."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, Any]] = []
        monkeypatch.setattr(D.dist, "is_initialized", lambda: False)
        monkeypatch.setattr(
            D.dist, "init_process_group", lambda *a, **k: self.calls.append(("init", (a, k)))
        )
        monkeypatch.setattr(D.dist, "barrier", lambda *a, **k: self.calls.append(("barrier", a)))
        monkeypatch.setattr(D, "_GROUP_TIMEOUT_S", None)


def test_init_process_group_joins_with_its_timeout_then_waits_for_every_rank(monkeypatch):
    """The group is created with the rank, size, backend and timeout asked for, every rank
    then meets the others at a barrier, and the timeout is remembered for current()."""
    group = _FakeGroup(monkeypatch)
    info = D.init_process_group(2, 3, device="cpu", init_method="file:///x", timeout_s=9)
    assert info == D.DistInfo(2, 3, 2, "gloo", 9.0)  # local rank: the rank when unsaid
    assert [c[0] for c in group.calls] == ["init", "barrier"]
    args, kwargs = group.calls[0][1]
    assert args == ("gloo",)
    assert kwargs == dict(
        init_method="file:///x", rank=2, world_size=3, timeout=D.datetime.timedelta(seconds=9)
    )
    assert D._GROUP_TIMEOUT_S == 9.0
    with pytest.raises(ValueError, match="outside world_size 3"):
        D.init_process_group(3, 3, device="cpu")


def test_init_process_group_on_a_gpu_selects_the_local_gpu_and_keeps_a_users_nccl_setting(
    monkeypatch,
):
    """NCCL: the process takes the GPU of its local rank, and the asynchronous error
    handling is set to 3 only where the user has not set it."""
    _FakeGroup(monkeypatch)
    chosen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "unset")  # restored afterwards
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    info = D.init_process_group(3, 4, device="cuda", local_rank=3)
    assert info.backend == "nccl" and chosen == [1]  # local rank 3 of 2 GPUs: GPU 1
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    D.init_process_group(0, 4, device="cuda")
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and chosen == [1, 0]


def test_local_gpu_without_visible_gpus_is_zero(monkeypatch):
    """With no GPU counted, every local rank maps to index 0 (no division by zero)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert [D.local_gpu(r) for r in range(4)] == [0, 0, 0, 0]


def test_init_from_env_joins_with_torchruns_local_rank_and_skips_a_world_of_one(monkeypatch):
    """A world of one joins no group; otherwise the group is joined with the environment's
    rank, size and local rank."""
    seen = []
    monkeypatch.setattr(D, "init_process_group", lambda *a, **k: seen.append((a, k)) or "joined")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert D.init_from_env("cpu") == D.DistInfo() and seen == []
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert D.init_from_env("cpu", 7.0) == "joined"
    assert seen == [((5, 8), dict(device="cpu", timeout_s=7.0, local_rank=1))]


def _joined_group(monkeypatch, rank: int, world_size: int, timeout_s: float) -> None:
    """torch.distributed as a gloo group of ``world_size`` joined as ``rank`` would answer."""
    monkeypatch.setattr(D.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(D.dist, "get_rank", lambda: rank)
    monkeypatch.setattr(D.dist, "get_world_size", lambda: world_size)
    monkeypatch.setattr(D.dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(D, "_GROUP_TIMEOUT_S", timeout_s)


def test_current_reads_the_group_and_shutdown_forgets_its_timeout(monkeypatch, no_torchrun_env):
    """Without torchrun's variables the local rank is the group's rank; after shutdown no
    timeout is remembered."""
    _joined_group(monkeypatch, rank=1, world_size=2, timeout_s=11.0)
    assert D.current() == D.DistInfo(1, 2, 1, "gloo", 11.0)
    destroyed = []
    monkeypatch.setattr(D.dist, "destroy_process_group", lambda: destroyed.append(1))
    D.shutdown()
    assert destroyed == [1] and D._GROUP_TIMEOUT_S is None


@pytest.mark.parametrize(
    "local_world, backend, ok",
    [(None, "nccl", True), ("many", "nccl", True), ("2", "gloo", True), ("2", "nccl", False)],
    ids=["unsaid", "unreadable", "gloo", "several-nccl"],
)
def test_naming_another_gpu_is_refused_only_for_several_nccl_processes_on_a_node(
    monkeypatch, local_world, backend, ok
):
    """``cuda:N`` other than the local rank's GPU is refused only where NCCL runs several
    processes on the node (LOCAL_WORLD_SIZE > 1; unset or unreadable counts as one)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    if local_world is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
    info = D.DistInfo(rank=1, world_size=2, local_rank=1, backend=backend, timeout_s=30.0)
    if ok:
        assert D.rank_device(torch.device("cuda", 3), info) == torch.device("cuda", 3)
    else:
        with pytest.raises(ValueError, match="whose GPU is cuda:1"):
            D.rank_device(torch.device("cuda", 3), info)


def test_describe_failure_reads_resets_as_a_peers_failure_and_the_default_timeout(monkeypatch):
    """A reset connection is a peer's failure; without a group timeout the message names the
    configured one."""
    monkeypatch.setenv(D.TIMEOUT_ENV, "45")
    info = D.DistInfo(rank=0, world_size=3, backend="gloo")
    msg = D.describe_failure(OSError("Connection reset by peer"), info)
    assert msg.startswith("distributed training stopped on rank 0 of 3 because a peer")
    assert "45 s timeout" in msg


class _Job:
    """A torchrun job that never ends on its own (for launch's timeout)."""

    def __init__(self, cmd, env=None, **kwargs):
        self.waits: list[Any] = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        raise subprocess.TimeoutExpired("torchrun", timeout)


def _fake_jobs(monkeypatch, job_class: type = _Job) -> tuple[list[Any], list[Any]]:
    """Make ``launch`` start ``job_class`` jobs in place of torchrun and record the jobs it
    kills: returns the lists of the jobs started and killed."""
    jobs: list[Any] = []
    killed: list[Any] = []

    def start(*a, **k):
        jobs.append(job_class(*a, **k))
        return jobs[-1]

    monkeypatch.setattr(subprocess, "Popen", start)
    monkeypatch.setattr(D, "_kill_job", killed.append)
    return jobs, killed


def test_launch_kills_a_job_past_its_timeout(monkeypatch):
    """Past ``timeout_s`` the whole job is killed and DistributedError says so."""
    jobs, killed = _fake_jobs(monkeypatch)
    with pytest.raises(D.DistributedError, match="2-process job did not finish within 5 s"):
        D.launch(["x"], 2, timeout_s=5.0)
    assert jobs[0].waits == [5.0] and killed == [jobs[0]]


def test_all_reduce_sum_sums_values_and_gradients_over_the_ranks(monkeypatch):
    """Forward is the sum over the ranks, backward the sum of the ranks' gradients; both
    collectives are counted in bytes. (Two ranks holding the same values: each sum doubles.)"""

    def two_equal_ranks(t, *a, **k):
        t.mul_(2)

    monkeypatch.setattr(D.dist, "all_reduce", two_equal_ranks)
    stats = D.comm.CommStats()
    x = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64, requires_grad=True)
    out = D.all_reduce_sum(x, stats)
    assert out.tolist() == [2.0, -4.0, 6.0]
    (out * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
    stats.end_iteration()
    assert stats.aux_bytes == [2 * 3 * 8]


def test_global_batchnorm_refuses_a_single_value_per_channel(one_rank_group, monkeypatch):
    """One value per channel over the whole global batch has no variance: refused."""
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    bn = nn.BatchNorm2d(3)
    D.sync_batchnorm(bn)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn(torch.randn(1, 3, 1, 1))
    assert bn(torch.randn(2, 3, 1, 1)).shape == (2, 3, 1, 1)


def test_sync_batchnorm_takes_the_latest_statistics_and_unsync_forgets_them():
    """Synchronising again points every batch norm at the new tally; undoing removes it."""
    m = bn_model()
    first, second = D.comm.CommStats(), D.comm.CommStats()
    D.sync_batchnorm(m, first)
    assert D.sync_batchnorm(m, second) == 0
    assert m[1]._pdt_comm_stats is second and m[3]._pdt_comm_stats is second
    D.unsync_batchnorm(m)
    assert not hasattr(m[1], "_pdt_comm_stats") and not hasattr(m[3], "_pdt_comm_stats")


def test_ddp_does_not_broadcast_buffers_before_each_forward():
    """Running statistics are already the same on every rank: no buffer broadcast."""
    kwargs = D._ddp_buffer_kwargs()
    assert len(kwargs) == 1 and list(kwargs.values()) == [False]


@pytest.mark.parametrize("value, timing", [(None, True), ("1", True), ("0", False)])
def test_comm_timing_defaults_from_the_environment(monkeypatch, value, timing):
    """Timing is on unless PDTBENCH_COMM_TIMING is "0"; an explicit argument wins."""
    if value is None:
        monkeypatch.delenv(D.COMM_TIMING_ENV, raising=False)
    else:
        monkeypatch.setenv(D.COMM_TIMING_ENV, value)
    assert D.DataParallel(D.DistInfo(), torch.device("cpu")).state.timing is timing
    assert D.DataParallel(D.DistInfo(), torch.device("cpu"), timing=not timing).state.timing is (
        not timing
    )


def _active_dp(monkeypatch, rank: int = 1) -> tuple[D.DataParallel, list[nn.Module]]:
    """A DataParallel of rank ``rank`` of 2 whose wrapper is a stand-in (no DDP, no group)."""
    info = D.DistInfo(rank=rank, world_size=2, local_rank=rank, backend="gloo", timeout_s=30.0)
    dp = D.DataParallel(info, torch.device("cpu"), timing=False)
    wrapped: list[nn.Module] = []

    def wrap(model):
        wrapped.append(model)
        dp._ddp = nn.Sequential(model)
        dp._sig = D._parameter_signature(model)
        dp.rebuilds += 1

    monkeypatch.setattr(dp, "_wrap", wrap)
    return dp, wrapped


def test_refresh_rebuilds_the_wrapper_only_when_parameters_change(monkeypatch):
    """The wrapper is rebuilt when a parameter is replaced, reshaped or frozen, and not
    when nothing changed."""
    dp, wrapped = _active_dp(monkeypatch)
    m = nn.Linear(3, 2)
    ctx = types.SimpleNamespace(model=m, extra={})
    dp.prepare(ctx)
    assert len(wrapped) == 1 and dp.module(ctx) is not m
    dp.refresh(ctx)
    assert len(wrapped) == 1
    m.bias.requires_grad_(False)
    dp.refresh(ctx)
    assert len(wrapped) == 2
    m.weight = nn.Parameter(torch.zeros(1, 3))
    dp.refresh(ctx)
    assert len(wrapped) == 3
    assert dp.summary({"comm_bytes_per_iter": 0}, ctx)["ddp_rebuilds"] == 3  # as built
    dp.release(ctx)
    assert dp.module(ctx) is m  # no wrapper after training


@pytest.mark.parametrize("differ", [False, True], ids=["same", "different"])
def test_ranks_compare_their_masks_by_min_and_max(monkeypatch, differ):
    """Two all-reduces (min and max) of the mask digest: equal means every rank holds the
    same masks; the check's bytes are counted."""
    dp, _ = _active_dp(monkeypatch)
    ops = []

    def all_reduce(t, op=None):
        ops.append(op)
        if differ and op == dist.ReduceOp.MAX:
            t.add_(1)  # another rank holds other masks

    monkeypatch.setattr(D.dist, "all_reduce", all_reduce)
    m = nn.Linear(3, 2)
    keep = torch.ones(2, 3, dtype=torch.bool)
    ctx = types.SimpleNamespace(model=m, extra={"comm_masks": {"weight": keep}})
    if differ:
        with pytest.raises(D.DistributedError, match="masks differ between ranks"):
            dp.prepare(ctx)
    else:
        dp.prepare(ctx)
    assert ops == [dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    dp.stats.end_iteration()
    assert dp.stats.aux_bytes == [2 * 3 * 8]  # two int64 digests of 3 values


def test_a_share_as_large_as_its_batch_is_accepted():
    """A single rank's share may be the whole batch (a batch of one sample on two ranks)."""
    dp = D.DataParallel(ACTIVE, torch.device("cpu"), timing=False)
    x, y = torch.ones(1, 2), torch.zeros(1, dtype=torch.long)
    assert dp.shard(x, y, n_global=1)[0] is x and (dp._n_local, dp._n_global) == (1, 1)


def test_global_loss_of_an_empty_share_is_the_others_mean_and_counts_its_bytes(one_rank_group):
    """A rank with no samples contributes zero (not its NaN mean) and still reaches every
    parameter; the loss value's all-reduce (one float64) is counted."""
    dp = D.DataParallel(D.DistInfo(world_size=2, backend="gloo"), torch.device("cpu"), False)
    w = nn.Parameter(torch.ones(2))
    x = torch.empty(0, 2)
    dp.shard(x, torch.empty(0, dtype=torch.long), n_global=4)
    out = x * w
    local = out.mean()  # NaN: the mean of nothing
    loss = dp.global_loss(local, out)
    assert loss.item() == 0.0
    loss.backward()
    assert w.grad is not None and w.grad.tolist() == [0.0, 0.0]
    dp.stats.end_iteration()
    assert dp.stats.aux_bytes == [8]


@pytest.mark.parametrize(
    "n_local, n_global, expected",
    [(4, 9, 2.5 - 1.0 / 9), (5, 9, 2.5 + 1.0 / 9), (3, 6, 2.5), (0, 1, 2.5)],
    ids=["smaller-share", "larger-share", "equal-shares", "empty-share"],
)
def test_backward_loss_weights_the_local_loss_by_its_share(n_local, n_global, expected):
    """total / world + (n_local / n_global - 1 / world) * local (two ranks; a total of 5 and
    a local loss of 2): the local mean's gradient weighted n_local / n_global, the rest of
    the total's 1 / 2; an empty share adds total / world."""
    dp = D.DataParallel(ACTIVE, torch.device("cpu"), timing=False)
    x = torch.zeros(n_local, 1)
    dp.shard(x, torch.zeros(n_local, dtype=torch.long), n_global=n_global)
    total, local = torch.tensor(5.0, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)
    assert dp.backward_loss(total, local).item() == pytest.approx(expected, rel=1e-12)


def test_broadcast_takes_rank_zeros_value(monkeypatch):
    """Every rank gets rank 0's value (here rank 1 of 2, rank 0 holding 7 and True)."""
    sources = []

    def broadcast(t, src):
        sources.append(src)
        t.fill_(7 if t.item() > 1 else 1)  # rank 0's decisions

    monkeypatch.setattr(D.dist, "broadcast", broadcast)
    dp, _ = _active_dp(monkeypatch)
    assert dp.broadcast_int(3) == 7
    assert dp.broadcast_flag(False) is True
    assert sources == [0, 0]
    assert D.DataParallel(D.DistInfo(), torch.device("cpu"), False).broadcast_flag(False) is False


def test_barrier_is_a_collective_only_with_several_processes(monkeypatch):
    """A barrier all-reduces once in a job, and does nothing in one process."""
    calls = []
    monkeypatch.setattr(D.dist, "all_reduce", lambda t, *a, **k: calls.append(t.clone()))
    D.DataParallel(D.DistInfo(), torch.device("cpu"), False).barrier()
    assert calls == []
    dp, _ = _active_dp(monkeypatch)
    dp.barrier()
    assert len(calls) == 1


def test_epoch_metrics_of_a_job_are_measured_and_start_afresh(monkeypatch):
    """With several processes the epoch's bytes are the hook's ("measured"), each epoch's
    tally is its own, and the summary reports the job's settings."""
    dp, _ = _active_dp(monkeypatch)
    m = nn.Linear(3, 2)
    ctx = types.SimpleNamespace(model=m, extra={})
    dp.stats.record(100)
    dp.end_iteration(ctx)
    row = dp.epoch_metrics(ctx)
    assert row["world_size"] == 2 and row["comm_bytes_source"] == "measured"
    assert row["comm_bytes_per_iter"] == 100
    dp.stats.record(40)
    dp.end_iteration(ctx)
    row = dp.epoch_metrics(ctx)
    assert row["comm_bytes_per_iter"] == 40 and row["comm_bytes_epoch"] == 40
    summary = dp.summary(row, ctx)
    assert summary["global_batchnorm"] is True and summary["comm_timing"] is False
    assert summary["distributed_backend"] == "gloo" and summary["comm_bytes_source"] == "measured"
    one = D.DataParallel(D.DistInfo(), torch.device("cpu"), timing=True)
    assert one.summary({}, ctx)["comm_timing"] is None  # nothing is timed in one process


def test_comm_masks_of_none_or_empty_are_none():
    """A hook returning an empty dict means dense: None."""
    ctx = types.SimpleNamespace(extra={})
    assert D.comm_masks(ctx, types.SimpleNamespace(comm_masks=lambda c: {})) is None
    assert D.comm_masks(types.SimpleNamespace(extra={"comm_masks": {}})) is None


class _Exit(Exception):
    """os._exit, made an exception so that the test sees the status."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Stopped(KeyboardInterrupt):
    """SIGTERM, as the command line raises it for a worker."""

    exit_code = 143


class _Agreed(RuntimeError):
    """A failure every rank finds at the same step (as a divergence)."""

    same_on_every_rank = True


def _worker_run(monkeypatch, capfd, rank: int, fn, launched: bool = False):
    """run_worker on rank ``rank`` of 2 (no group): ``(status or result, stderr, shut down)``."""
    info = D.DistInfo(rank=rank, world_size=2, local_rank=rank, backend="gloo", timeout_s=30.0)
    monkeypatch.setattr(D, "init_from_env", lambda *a: info)
    shut = []
    monkeypatch.setattr(D, "shutdown", lambda: shut.append(1))

    def exit_(code):
        raise _Exit(code)

    monkeypatch.setattr(D.os, "_exit", exit_)
    if launched:
        monkeypatch.setenv(D.LAUNCHED_ENV, "1")
    else:
        monkeypatch.delenv(D.LAUNCHED_ENV, raising=False)
    capfd.readouterr()
    try:
        outcome = D.run_worker(fn, "cpu", prog="job")
    except _Exit as stop:
        outcome = stop.code
    return outcome, capfd.readouterr().err, bool(shut)


def _raise(err: BaseException):
    def fn():
        raise err

    return fn


@pytest.mark.parametrize(
    "rank, fn, launched, status, said, traceback",
    [
        (1, lambda: "done", False, "done", "", False),
        (1, _raise(KeyboardInterrupt()), False, 130, "job: stopped (Ctrl-C) on rank 1 of 2", False),
        (0, _raise(_Stopped()), False, 143, "job: stopped (SIGTERM) on rank 0 of 2", False),
        (1, _raise(KeyboardInterrupt()), True, 130, "", False),
        (0, _raise(_Agreed("diverged")), False, D.EXIT_DIST_FAILURE, "job: error: diverged", False),
        (1, _raise(_Agreed("diverged")), False, D.EXIT_DIST_FAILURE, "", False),
        (1, _raise(RuntimeError("[gloo] Connection closed by peer")), False,
         D.EXIT_PEER_STOPPED, "job: error: distributed training stopped on rank 1 of 2", False),
        (0, _raise(ValueError("bad")), False, D.EXIT_DIST_FAILURE,
         "job: error: distributed training failed on rank 0 of 2: ValueError: bad", True),
    ],
    ids=["success", "ctrl-c", "sigterm", "ctrl-c-launched", "agreed-rank0", "agreed-rank1",
         "peer", "own"],
)  # fmt: skip
def test_run_worker_ends_a_rank_with_a_status_and_one_line(
    monkeypatch, capfd, rank, fn, launched, status, said, traceback
):
    """How a rank ends: a success leaves the group and returns the result; a stop by a
    signal exits with its status (130 Ctrl-C, 143 SIGTERM) and names the rank, except under
    launch(); a failure every rank finds is said once, by rank 0; a peer's failure exits 4
    without a traceback; a rank's own failure exits 3 after its traceback."""
    outcome, err, shut = _worker_run(monkeypatch, capfd, rank, fn, launched)
    assert outcome == status
    assert shut is (status == "done")
    lines = [line for line in err.splitlines() if line.startswith("job:")]
    if said:
        assert len(lines) == 1 and lines[0].startswith(said)
    else:
        assert lines == []
    assert ("Traceback" in err) is traceback


def test_the_default_collective_timeout_is_five_minutes(monkeypatch):
    """docs/distributed.md: ``--dist-timeout`` / ``PDTBENCH_DIST_TIMEOUT`` default to 300 s."""
    monkeypatch.delenv(D.TIMEOUT_ENV, raising=False)
    assert D.timeout_seconds() == 300.0
    monkeypatch.setenv(D.TIMEOUT_ENV, "")  # set but empty: the default too
    assert D.timeout_seconds() == 300.0


def test_current_takes_the_local_rank_torchrun_gives(monkeypatch, no_torchrun_env):
    """Under torchrun the local rank is LOCAL_RANK (rank 3 of 4 is local rank 1 on the second
    node of two), not the global rank."""
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    _joined_group(monkeypatch, rank=3, world_size=4, timeout_s=20.0)
    assert D.current() == D.DistInfo(3, 4, 1, "gloo", 20.0)


def test_global_batchnorm_cumulative_average_over_different_batches(one_rank_group, monkeypatch):
    """``momentum=None``: the running statistics are the plain average of every batch's
    (batch k weighted 1/k), as in torch's batch norm. Two batches of one channel, means 1 and
    3, unbiased variances 1 and 4: running mean 2, running variance 2.5."""
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    bn = nn.BatchNorm2d(1, momentum=None)
    D.sync_batchnorm(bn)
    bn(torch.tensor([0.0, 1.0, 2.0]).view(3, 1, 1, 1))  # mean 1, unbiased variance 1
    bn(torch.tensor([1.0, 3.0, 5.0]).view(3, 1, 1, 1))  # mean 3, unbiased variance 4
    assert torch.allclose(bn.running_mean, torch.tensor([2.0]))
    assert torch.allclose(bn.running_var, torch.tensor([2.5]))
    assert int(bn.num_batches_tracked) == 2


def test_one_process_reports_no_collective_columns():
    """One process sends nothing: its epoch rows have no time, auxiliary bytes or calls of
    collectives, and a summary without a measured figure gives the computed payload (a
    Linear(3, 2): 8 float32 values, 32 bytes)."""
    m = nn.Linear(3, 2)
    dp = D.DataParallel(D.DistInfo(), torch.device("cpu"), timing=True)
    ctx = types.SimpleNamespace(model=m, extra={})
    dp.prepare(ctx)
    dp.end_iteration(ctx)
    row = dp.epoch_metrics(ctx)
    for key in ("comm_ms", "comm_aux_bytes_per_iter", "comm_calls_per_iter"):
        assert key not in row
    summary = dp.summary({}, ctx)
    assert summary["comm_bytes_per_iter"] == 32 and summary["comm_bytes_source"] == "computed"
    assert summary["ddp_rebuilds"] == 0


class _Stubborn:
    """A job that ignores SIGTERM and ends only when killed."""

    pid = 12345

    def __init__(self) -> None:
        self.sent: list[int] = []

    def wait(self, timeout=None):
        import signal

        if self.sent[-1] != signal.SIGKILL:
            raise subprocess.TimeoutExpired("torchrun", timeout)
        return -9


def test_a_job_that_ignores_sigterm_is_killed(monkeypatch):
    """Stopping a job asks its process group to stop (SIGTERM), then kills it (SIGKILL)."""
    import signal

    job = _Stubborn()
    monkeypatch.setattr(os, "killpg", lambda pid, sig: job.sent.append(sig))
    D._kill_job(job)
    assert job.sent == [signal.SIGTERM, signal.SIGKILL]


def test_a_rank_that_raised_is_named_before_one_killed_earlier():
    """The rank that raised is the cause even when a rank killed by a signal failed first."""
    from types import SimpleNamespace as F

    from impl.launch_agent import first_failure

    raised = F(exitcode=3, timestamp=101)
    killed = F(exitcode=-11, timestamp=100)
    assert first_failure({0: killed, 1: raised}) == (1, raised)


def test_a_worker_that_exited_with_status_zero_is_said_so():
    from impl.launch_agent import how_it_ended

    assert how_it_ended(0) == "exit status 0"


def test_the_agent_exits_128_plus_the_signal_or_1_naming_the_failed_rank(monkeypatch, capsys):
    """Stopped by SIGTERM the agent exits 143 (SIGINT: 130); when a worker failed it exits 1
    and names the rank that raised, with how it ended."""
    import signal
    from types import SimpleNamespace as F

    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from impl import launch_agent

    monkeypatch.setenv("LOGLEVEL", "WARNING")  # the test process's loggers left as they are

    def stopped(sig):
        def main(args):
            raise SignalException("stopped", sig)

        return main

    monkeypatch.setattr(torchrun, "main", stopped(signal.SIGTERM))
    assert launch_agent.main([]) == 143
    monkeypatch.setattr(torchrun, "main", stopped(signal.SIGINT))
    assert launch_agent.main([]) == 130

    failed = ChildFailedError.__new__(ChildFailedError)
    failed.failures = {
        0: F(exitcode=4, timestamp=100),
        1: F(exitcode=-9, timestamp=100),
    }

    def fail(args):
        raise failed

    monkeypatch.setattr(torchrun, "main", fail)
    assert launch_agent.main([]) == 1
    err = capsys.readouterr().err
    assert "torchrun: rank 1 failed first (killed by SIGKILL: out of memory, most often)" in err
    monkeypatch.setattr(torchrun, "main", lambda args: None)
    assert launch_agent.main([]) == 0


def test_the_agent_quiets_torchruns_loggers_unless_loglevel_is_set(monkeypatch):
    """Without LOGLEVEL every torch.distributed logger of the agent logs at ERROR; with it,
    the levels are left as they were."""
    import logging

    from impl.launch_agent import quiet_agent_logs

    names = ["torch.distributed", "torch.distributed.elastic.agent.server.api"]
    loggers = [logging.getLogger(n) for n in names]
    every = [logging.getLogger(n) for n in logging.root.manager.loggerDict]
    every = [lg for lg in every if lg.name.startswith("torch.distributed")]
    saved = [(lg, lg.level) for lg in every]
    try:
        for lg in loggers:
            lg.setLevel(logging.NOTSET)
        monkeypatch.setenv("LOGLEVEL", "INFO")
        quiet_agent_logs()
        assert [lg.level for lg in loggers] == [logging.NOTSET, logging.NOTSET]
        monkeypatch.delenv("LOGLEVEL")
        quiet_agent_logs()
        assert [lg.level for lg in loggers] == [logging.ERROR, logging.ERROR]
    finally:
        for lg, level in saved:
            lg.setLevel(level)


def test_init_process_group_keeps_the_local_rank_it_is_given(monkeypatch):
    """Rank 3 of 4 on the second node of two is local rank 1 there."""
    _FakeGroup(monkeypatch)
    info = D.init_process_group(3, 4, device="cpu", timeout_s=9, local_rank=1)
    assert info == D.DistInfo(3, 4, 1, "gloo", 9.0)


def test_a_launch_interrupted_by_ctrl_c_kills_its_job(monkeypatch):
    """Ctrl-C in the launching process stops the whole job before it goes on."""

    class Interrupted(_Job):
        def wait(self, timeout=None):
            raise KeyboardInterrupt

    jobs, killed = _fake_jobs(monkeypatch, Interrupted)
    with pytest.raises(KeyboardInterrupt):
        D.launch(["x"], 2)
    assert killed == [jobs[0]]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
@pytest.mark.parametrize("parent_alive", [True, False], ids=["alive", "already-dead"])
def test_a_worker_asks_to_stop_with_its_launcher(monkeypatch, parent_alive):
    """The job asks Linux for SIGTERM when its launcher dies, and stops at once when the
    launcher died before it asked."""
    import ctypes
    import signal

    asked, sent = [], []

    class Libc:
        def __init__(self, *a, **k):
            pass

        def prctl(self, option, sig):
            asked.append((option, sig))

    monkeypatch.setattr(ctypes, "CDLL", Libc)
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    parent = os.getppid() if parent_alive else os.getppid() + 1
    D._stop_with_parent(parent)()
    assert asked == [(1, signal.SIGTERM)]  # PR_SET_PDEATHSIG
    assert sent == ([] if parent_alive else [(os.getpid(), signal.SIGTERM)])


def test_release_restores_the_models_own_batch_norm(monkeypatch):
    """At the end of training of a job the model's batch norm computes its own statistics
    again."""
    dp, _ = _active_dp(monkeypatch)
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    ctx = types.SimpleNamespace(model=m, extra={})
    D.sync_batchnorm(m)
    dp.prepare(ctx)
    dp.release(ctx)
    assert "forward" not in m[1].__dict__
