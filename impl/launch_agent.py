"""torchrun's agent as ``pdtbench train --nproc N`` starts it.

``python -m impl.launch_agent ARGS`` is ``python -m torch.distributed.run ARGS`` but for how
two endings are reported:

- **Stopped by a signal** (the launcher stopping the job on Ctrl-C, or on a SIGTERM of its
  own): exits with the shell's status for it, 128 + its number, without a traceback of
  torch's monitoring loop; the launcher says what was kept and how to resume (``impl.cli``).
- **A worker failed**: the worker has printed its error and its rank
  (:func:`impl.distributed.run_worker`); the agent adds one line naming the rank that failed
  first and how it ended, instead of a traceback and torchrun's table of every rank.

Everything else (a bad flag, a rendezvous error) is reported as torchrun reports it; the
agent's own loggers log at ERROR unless ``LOGLEVEL`` is set (:func:`quiet_agent_logs`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun with ``argv`` (default: the command line); return 0 when every worker
    succeeded, 1 when one failed (saying which, and how), or 128 + the signal's number when
    the agent was stopped by one."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    quiet_agent_logs()

    try:
        torchrun_main(None if argv is None else list(argv))
    except SignalException as stop:
        return 128 + int(stop.sigval)
    except ChildFailedError as failed:
        rank, failure = first_failure(failed.failures)
        from impl.distributed import write_stderr_line

        write_stderr_line(
            f"torchrun: rank {rank} failed first ({how_it_ended(failure.exitcode)}) and the "
            "other ranks were stopped; what the rank printed is above"
        )
        return 1
    return 0


def quiet_agent_logs() -> None:
    """Raise this process's torchrun loggers to ERROR unless ``LOGLEVEL`` is set: the agent
    logs at WARNING as it stops workers ("Received 2 death signal, shutting down workers",
    "Sending process N closing signal SIGTERM"), lines about its own mechanics beside which
    pdtbench says what happened and how to continue. The agent's process only: the workers'
    environment is left as it was (torchrun passes it on)."""
    if os.environ.get("LOGLEVEL"):
        return
    names = [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed")]
    for name in ["torch.distributed", *names]:
        logging.getLogger(name).setLevel(logging.ERROR)


#: How a worker the agent stopped ends: killed by SIGTERM, or (a pdtbench worker turns it
#: into an exception, :class:`impl.cli.Terminated`) exiting with the shell's 128 + SIGTERM.
STOPPED_BY_AGENT: tuple[int, ...] = (-signal.SIGTERM, 128 + signal.SIGTERM)


def first_failure(failures: dict[int, Any]) -> tuple[int, Any]:
    """The rank, and its failure, to name among the failed ranks ``failures`` (rank ->
    torchrun's ``ProcessFailure``): the cause before its consequences. A rank that raised
    (a positive status other than :data:`impl.distributed.EXIT_PEER_STOPPED`) comes first,
    then one killed by a signal (out of memory, a crash), then one stopped by SIGTERM (how
    the agent stops the others: :data:`STOPPED_BY_AGENT`), then one stopped by a peer's
    failure; among equals the first to fail, ties to the lower rank. torchrun's own "first"
    compares timestamps in whole seconds, and named rank 0 when the survivor exited in the
    same second."""
    from impl.distributed import EXIT_PEER_STOPPED

    def order(rank: int) -> tuple[int, float, int]:
        code = failures[rank].exitcode
        if code == EXIT_PEER_STOPPED:
            kind = 3
        elif code in STOPPED_BY_AGENT:
            kind = 2
        elif code < 0:
            kind = 1
        else:
            kind = 0
        return kind, failures[rank].timestamp, rank

    rank = min(failures, key=order)
    return rank, failures[rank]


def how_it_ended(exitcode: int) -> str:
    """A worker's end in words: ``"exit status 3"`` (status 4: stopped by a peer's failure,
    :data:`impl.distributed.EXIT_PEER_STOPPED`), or the signal that killed it (a negative
    ``exitcode``, as :mod:`subprocess` reports one), SIGKILL with its usual cause."""
    from impl.distributed import EXIT_PEER_STOPPED

    if exitcode == EXIT_PEER_STOPPED:
        return f"exit status {exitcode}: stopped because a peer failed"
    if exitcode in STOPPED_BY_AGENT[1:]:
        return f"exit status {exitcode}: stopped by SIGTERM"
    if exitcode >= 0:
        return f"exit status {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    if name == "SIGKILL":
        return "killed by SIGKILL: out of memory, most often"
    return f"killed by {name}"


if __name__ == "__main__":
    sys.exit(main())
