"""A rank that dies or hangs makes the other exit with a clear error within the timeout.

Two gloo ranks run :func:`impl.distributed.run_worker` (the CLI's worker path) around a loop
of all-reduces; the test kills (SIGKILL) or freezes (SIGSTOP) one of them and times how long
the survivor takes to exit, with which status and message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from impl import distributed

#: The cases share one run of every failure (a module fixture): one xdist worker runs them all.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("distributed-failures")]

TIMEOUT_S = 4.0  # the collective timeout of the test's group
SLACK_S = 20.0  # the survivor's own start-up and exit on a loaded machine

WORKER = """
import sys, time, torch
from impl import distributed
def work():
    dp = distributed.DataParallel(distributed.current(), torch.device("cpu"), timing=False)
    print("ready", flush=True)
    while True:
        dp.reduce([1.0])
        time.sleep(0.01)
distributed.run_worker(work, "cpu", float(sys.argv[1]), prog="worker")
"""


def start(rank: int, port: int) -> subprocess.Popen:
    env = dict(
        os.environ,
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(TIMEOUT_S)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


CASES = {
    "kill-rank1": (1, signal.SIGKILL),
    "kill-rank0-store-host": (0, signal.SIGKILL),  # rank 0 also hosts the rendezvous store
    "freeze-rank1": (1, signal.SIGSTOP),
}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, tuple[int | None, float, str]]:
    """Run every case at once (3 pairs of ranks): ``{case: (status, seconds, stderr)}``."""
    pairs = {}
    try:
        for case in CASES:
            port = distributed.free_port()
            pairs[case] = [start(0, port), start(1, port)]
        for procs in pairs.values():  # both joined the group and all-reduce in a loop
            for p in procs:
                assert p.stdout.readline().strip() == "ready", p.stderr.read()
        t0 = {}
        for case, (victim, sig) in CASES.items():
            t0[case] = time.monotonic()
            os.kill(pairs[case][victim].pid, sig)
        out = {}
        for case, (victim, _) in CASES.items():
            survivor = pairs[case][1 - victim]
            left = TIMEOUT_S + SLACK_S - (time.monotonic() - t0[case])
            try:
                rc = survivor.wait(timeout=max(left, 0.1))
            except subprocess.TimeoutExpired:
                rc = None
            out[case] = (
                rc,
                time.monotonic() - t0[case],
                "" if rc is None else survivor.stderr.read(),
            )
        return out
    finally:
        for procs in pairs.values():
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_survivor_exits_with_clear_error_within_timeout(outcomes, case):
    victim, sig = CASES[case]
    rc, elapsed, err = outcomes[case]
    assert rc is not None, f"the survivor did not exit within {TIMEOUT_S + SLACK_S} s"
    assert rc == distributed.EXIT_PEER_STOPPED, err
    assert (
        f"worker: error: distributed training stopped on rank {1 - victim} of 2 because a "
        "peer process exited or hung"
    ) in err
    assert elapsed < TIMEOUT_S + SLACK_S
    if sig == signal.SIGSTOP:  # a frozen peer is only noticed by the timeout
        assert elapsed >= TIMEOUT_S * 0.9
