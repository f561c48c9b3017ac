"""torchrun's agent as ``pdtbench train --nproc N`` starts it.

``python -m impl.launch_agent ARGS`` is ``python -m torch.distributed.run ARGS``, except
that a stop by a signal (the launcher stopping the job when its user pressed Ctrl-C, or when
it was sent SIGTERM itself) ends the agent with the shell's status for that signal,
128 + its number, instead of a traceback of the agent's own code: the launcher has said
what was kept and how to resume (``impl.cli``), and the stack of torch's monitoring loop
told the user nothing. Every other outcome (a worker's failure, a bad flag) is torchrun's,
unchanged.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun with ``argv`` (default: the command line); return 0 when every worker
    succeeded, or 128 + the signal's number when the agent was stopped by one."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(None if argv is None else list(argv))
    except SignalException as stop:
        return 128 + int(stop.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
