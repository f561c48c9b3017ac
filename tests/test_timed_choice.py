"""impl.ops.timed_choice: the fastest path, timed once per problem; pinning; what it picked."""

import contextlib
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from impl.ops import timed_choice


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(timed_choice, "_CHOICE", {})
    monkeypatch.setattr(timed_choice, "_TIMES", {})
    monkeypatch.setattr(timed_choice, "_PATHS", {})
    monkeypatch.setattr(timed_choice, "_USES", Counter())
    monkeypatch.setattr(timed_choice, "_HOW", {})
    timed_choice.register("spmm", ("row_tiled", "warp_row"), same_bits=True)


def test_choose_timed_takes_the_fastest_once_per_problem():
    timed = []

    def time_ms(p):
        timed.append(p)
        return {"row_tiled": 2.5, "warp_row": 1.5}[p]

    both = ("row_tiled", "warp_row")
    problem = "torch.float32 256x1152x50176 batch 1 nnz 117964 vec cuda:0"
    assert timed_choice.choose_timed("spmm", problem, both, time_ms) == "warp_row"
    assert timed_choice.choose_timed("spmm", problem, both, time_ms) == "warp_row"
    assert timed == ["row_tiled", "warp_row"], "a problem is timed once"
    assert timed_choice.timed_choices() == {
        f"spmm: {problem}": {"path": "warp_row", "ms": {"row_tiled": 2.5, "warp_row": 1.5}}
    }
    assert timed_choice.choose_timed("spmm", "other", both, lambda p: 1.0) == "row_tiled", (
        "a tie goes to the first candidate"
    )
    assert timed_choice.choose_timed("weight_grad", problem, ("sddmm",), time_ms) == "sddmm"
    assert timed == ["row_tiled", "warp_row"], "a lone candidate is not timed"
    with pytest.raises(ValueError, match="no candidate path"):
        timed_choice.choose_timed("spmm", "none", (), time_ms)


def test_a_remembered_choice_that_cannot_run_is_not_used():
    timed_choice.choose_timed("spmm", "p", ("row_tiled", "warp_row"), lambda p: len(p))
    assert timed_choice.choose_timed("spmm", "p", ("warp_row",), lambda p: 0.0) == "warp_row"


def test_forced_paths_nest_and_end_with_their_block():
    assert timed_choice.forced_path("spmm") is None
    with timed_choice.forced("spmm", "warp_row"):
        assert timed_choice.forced_path("spmm") == "warp_row"
        with timed_choice.forced("spmm", "row_tiled"):
            assert timed_choice.forced_path("spmm") == "row_tiled"
        assert timed_choice.forced_path("spmm") == "warp_row"
        assert timed_choice.forced_path("weight_grad") is None
    assert timed_choice.forced_path("spmm") is None
    with pytest.raises(RuntimeError), timed_choice.forced("spmm", "warp_row"):
        raise RuntimeError("the block fails")
    assert timed_choice.forced_path("spmm") is None


def test_no_timing_off_a_gpu():
    assert not timed_choice.can_time(torch.zeros(3))


def test_cuda_ms_rejects_no_repeats():
    with pytest.raises(ValueError, match="reps must be >= 1"):
        timed_choice.cuda_ms(lambda: None, reps=0)


@pytest.mark.gpu
def test_cuda_ms_measures_device_time():
    """A spin kernel twice as long takes about twice the milliseconds by the events.

    The least of five timings each: the GPU tests may share the device with other processes
    (pytest-xdist workers), whose kernels can only add time to a window, never remove it."""
    cycles = 2_000_000  # about 1 ms at 2 GHz
    one = min(timed_choice.cuda_ms(lambda: torch.cuda._sleep(cycles)) for _ in range(5))
    two = min(timed_choice.cuda_ms(lambda: torch.cuda._sleep(2 * cycles)) for _ in range(5))
    assert one > 0.1
    assert 1.5 < two / one < 2.5


def test_uses_count_each_path_an_op_ran(monkeypatch):
    assert timed_choice.uses() == {}
    timed_choice.record_use("spmm", "row_tiled")
    timed_choice.record_use("spmm", "row_tiled")
    timed_choice.record_use("weight_grad", "sddmm")
    assert timed_choice.uses() == {"spmm row_tiled": 2, "weight_grad sddmm": 1}


def test_registered_ops_name_their_paths_and_pick_checks_the_op(monkeypatch):
    assert timed_choice.register("demo", ["a", "b"], same_bits=True) == ("a", "b")
    assert timed_choice.registered() == {"spmm": ("row_tiled", "warp_row"), "demo": ("a", "b")}
    with pytest.raises(ValueError, match="demo: no paths"):
        timed_choice.register("demo", [], same_bits=True)
    with pytest.raises(ValueError, match="unknown op 'other'; registered: demo, spmm"):
        timed_choice.pick("other", "p", ("a",), lambda p: None, torch.zeros(1))
    with pytest.raises(ValueError, match="unknown demo path 'c'; valid: a, b"):
        timed_choice.forced("demo", "c")
    assert timed_choice.check_path("demo", "b") == "b"
    with pytest.raises(ValueError, match="unknown demo path 'c'; valid: a, b"):
        timed_choice.check_path("demo", "c")
    # off a GPU nothing is timed: the first candidate, or the forced one where it can run
    assert timed_choice.pick("demo", "p", ("b", "a"), lambda p: None, torch.zeros(1)) == "b"
    with timed_choice.forced("demo", "a"):
        assert timed_choice.pick("demo", "p", ("b", "a"), lambda p: None, torch.zeros(1)) == "a"
        assert timed_choice.pick("demo", "p", ("b",), lambda p: None, torch.zeros(1)) == "b"


def test_a_graph_capture_is_looked_for_on_the_tensors_gpu(monkeypatch):
    # It asked the current GPU's stream: a capture on the tensor's GPU (not the current one)
    # was timed through, and its synchronisation broke the capture.
    current, capturing = [0], {0: False, 2: True}

    @contextlib.contextmanager
    def on(device):
        before, current[0] = current[0], torch.device(device).index
        yield
        current[0] = before

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", on)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[current[0]])
    t = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 2))
    assert not timed_choice.can_time(t) and current == [0]
    capturing.update({0: True, 2: False})
    assert timed_choice.can_time(t)


def test_no_timing_of_fake_tensors_that_torch_compile_traces():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(2, device="cuda")  # no GPU needed: nothing runs
    assert fake.is_cuda and not timed_choice.can_time(fake)


def test_calls_made_while_timing_are_not_uses(monkeypatch):

    def time_ms(p):
        timed_choice.record_use("spmm", p)  # an inner op run by the candidate being timed
        return {"row_tiled": 2.0, "warp_row": 1.0}[p]

    assert timed_choice.choose_timed("spmm", "q", ("row_tiled", "warp_row"), time_ms) == "warp_row"
    assert timed_choice.uses() == {}
    timed_choice.record_use("spmm", "warp_row")
    assert timed_choice.uses() == {"spmm warp_row": 1}


def test_pick_uses_the_remembered_choice_where_it_cannot_time(monkeypatch):
    """Where timing is not possible (CUDA-graph capture; here a CPU tensor), an op whose
    paths give the same bits runs what an earlier timing chose; an op with different bits
    runs its default unless cuDNN may choose by timing."""
    timed_choice.register("grad", ("sparse", "dense"), same_bits=False)
    for op, best in (("spmm", "warp_row"), ("grad", "dense")):
        times = {p: 1.0 if p == best else 2.0 for p in timed_choice.registered()[op]}
        timed_choice.choose_timed(op, "p", timed_choice.registered()[op], times.get)
    cpu = torch.zeros(1)
    none = lambda p: None  # noqa: E731
    assert timed_choice.pick("spmm", "p", ("row_tiled", "warp_row"), none, cpu) == "warp_row"
    assert timed_choice.pick("spmm", "other", ("row_tiled", "warp_row"), none, cpu) == "row_tiled"
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    assert timed_choice.pick("grad", "p", ("sparse", "dense"), none, cpu) == "sparse"
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    assert timed_choice.pick("grad", "p", ("sparse", "dense"), none, cpu) == "dense"


def test_pick_says_how_each_path_was_chosen(monkeypatch):
    """``how_chosen``: forced where the pinned path ran, fallback where it could not run this
    problem, timed only where candidates were compared, default for a lone candidate; and a
    remembered choice is used only when it can run this problem."""
    monkeypatch.setattr(timed_choice, "can_time", lambda t: True)
    monkeypatch.setattr(timed_choice, "cuda_ms", lambda fn, device=None: fn())
    costs = {"row_tiled": 2.0, "warp_row": 1.0}
    run = costs.get
    like = torch.zeros(1)
    both = ("row_tiled", "warp_row")
    assert timed_choice.pick("spmm", "a", both, run, like) == "warp_row"
    assert timed_choice.how_chosen() == {"spmm warp_row": "timed"}
    assert timed_choice.pick("spmm", "b", ("row_tiled",), run, like) == "row_tiled"
    assert timed_choice.how_chosen()["spmm row_tiled"] == "default"  # nothing to compare
    with timed_choice.forced("spmm", "warp_row"):
        assert timed_choice.pick("spmm", "c", ("row_tiled",), run, like) == "row_tiled"
        assert timed_choice.how_chosen()["spmm row_tiled"] == "fallback"
        assert timed_choice.pick("spmm", "c", both, run, like) == "warp_row"
        assert timed_choice.how_chosen()["spmm warp_row"] == "forced"
    monkeypatch.setattr(timed_choice, "can_time", lambda t: False)  # say, a graph capture
    assert timed_choice.pick("spmm", "a", ("row_tiled",), run, like) == "row_tiled"  # not a's


def test_a_remembered_choice_is_taken_without_asking_whether_timing_could_run(monkeypatch):
    # Every call of a timed op asked can_time (a query of the GPU's capture state, and of
    # the current device) before finding the choice it had remembered.
    monkeypatch.setattr(timed_choice, "cuda_ms", lambda fn, device=None: fn())
    monkeypatch.setattr(timed_choice, "can_time", lambda t: True)
    costs = {"row_tiled": 2.0, "warp_row": 1.0}
    both = ("row_tiled", "warp_row")
    assert timed_choice.pick("spmm", "once", both, costs.get, torch.zeros(1)) == "warp_row"
    monkeypatch.setattr(timed_choice, "can_time", lambda t: pytest.fail("asked again"))
    for _ in range(3):
        assert timed_choice.pick("spmm", "once", both, costs.get, torch.zeros(1)) == "warp_row"


def test_cuda_ms_is_per_call(monkeypatch):
    """The events' span divided by the calls between them (a stand-in clock: 30 ms for 3)."""

    class Event:
        clock = [0.0]

        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at = Event.clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.at - self.at

    def call():
        Event.clock[0] += 10.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    assert timed_choice.cuda_ms(call, reps=3) == pytest.approx(10.0)


def test_readings_list_op_and_path_in_sorted_order(monkeypatch):
    """``uses`` and ``how_chosen`` list ``"op path"`` in sorted order, whatever order the
    calls came in."""
    for op, path in (("spmm", "warp_row"), ("grad", "dense"), ("spmm", "row_tiled")):
        timed_choice.record_use(op, path, "timed")
    want = ["grad dense", "spmm row_tiled", "spmm warp_row"]
    assert list(timed_choice.uses()) == want
    assert list(timed_choice.how_chosen()) == want


def test_a_forced_path_that_cannot_run_falls_back_to_the_first_candidate(monkeypatch):
    """Where the pinned path is not among the candidates, the first candidate runs (not
    any other), and it is counted as a fallback."""
    timed_choice.register("demo", ("a", "b", "c"), same_bits=True)
    with timed_choice.forced("demo", "c"):
        assert timed_choice.pick("demo", "p", ("b", "a"), lambda p: None, torch.zeros(1)) == "b"
    assert timed_choice.how_chosen() == {"demo b": "fallback"}


def test_a_remembered_choice_among_one_candidate_counts_as_default(monkeypatch):
    """A choice remembered from an earlier timing, picked where it is the only candidate,
    was not compared with anything: ``default``, not ``timed``."""
    both = ("row_tiled", "warp_row")
    timed_choice.choose_timed("spmm", "p", both, {"row_tiled": 2.0, "warp_row": 1.0}.get)
    cpu = torch.zeros(1)
    assert timed_choice.pick("spmm", "p", ("warp_row",), lambda p: None, cpu) == "warp_row"
    assert timed_choice.how_chosen() == {"spmm warp_row": "default"}
    assert timed_choice.pick("spmm", "p", both, lambda p: None, cpu) == "warp_row"
    assert timed_choice.how_chosen() == {"spmm warp_row": "timed"}


def test_pick_times_the_candidates_on_the_tensors_device(monkeypatch):
    """The candidates are timed on the stream of the GPU that holds ``like`` (the ops'
    kernels run there), not on the current GPU."""
    devices = []

    def cuda_ms(fn, device=None):
        devices.append(device)
        return {"row_tiled": 2.0, "warp_row": 1.0}[fn()]

    monkeypatch.setattr(timed_choice, "can_time", lambda t: True)
    monkeypatch.setattr(timed_choice, "cuda_ms", cuda_ms)
    like = SimpleNamespace(device=torch.device("cuda", 1))
    both = ("row_tiled", "warp_row")
    assert timed_choice.pick("spmm", "d", both, lambda p: p, like) == "warp_row"
    assert devices == [torch.device("cuda", 1)] * 2


def test_an_unknown_op_is_a_value_error_naming_the_registered_ones():
    """``check_path`` and ``forced`` reject an op that was never registered with a
    ValueError listing the registered ops."""
    with pytest.raises(ValueError, match="unknown op 'nope'; valid: spmm"):
        timed_choice.check_path("nope", "row_tiled")
    with pytest.raises(ValueError, match="unknown op 'nope'; valid: spmm"):
        timed_choice.forced("nope", "row_tiled")


def test_a_remembered_choice_outside_the_candidates_gives_way_to_them():
    """A problem timed before whose choice cannot run this call takes a candidate that
    can (a lone one, untimed), and the earlier choice stays remembered."""
    both = ("row_tiled", "warp_row")
    timed_choice.choose_timed("spmm", "p", both, {"row_tiled": 2.0, "warp_row": 1.0}.get)
    untimed = lambda p: pytest.fail("timed")  # noqa: E731
    assert timed_choice.choose_timed("spmm", "p", ("row_tiled",), untimed) == "row_tiled"
    assert timed_choice.timed_choices()["spmm: p"]["path"] == "warp_row"


def test_a_timing_that_fails_leaves_later_calls_counted(monkeypatch):
    """A candidate that raises while being timed ends the timing: calls after it are
    counted as uses again."""

    def time_ms(p):
        raise RuntimeError("kernel failed")

    with pytest.raises(RuntimeError, match="kernel failed"):
        timed_choice.choose_timed("spmm", "q", ("row_tiled", "warp_row"), time_ms)
    timed_choice.record_use("spmm", "row_tiled")
    assert timed_choice.uses() == {"spmm row_tiled": 1}


def _logged_events(monkeypatch, log: list[str], elapsed_ms: float) -> None:
    """Replace torch.cuda.Event by events that log each record, synchronize and read into
    ``log``, and read ``elapsed_ms`` between any two."""

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            log.append("record")

        def synchronize(self):
            log.append("synchronize")

        def elapsed_time(self, end):
            log.append("read")
            return elapsed_ms

    monkeypatch.setattr(torch.cuda, "Event", Event)


def test_cuda_ms_warms_up_once_outside_the_timed_span(monkeypatch):
    """One untimed call before the start event, then ``reps`` calls between the events."""
    log: list[str] = []
    _logged_events(monkeypatch, log, 6.0)
    assert timed_choice.cuda_ms(lambda: log.append("call"), reps=2) == pytest.approx(3.0)
    assert log == ["call", "record", "call", "call", "record", "synchronize", "read"]


@pytest.mark.parametrize(("device", "entered"), [(torch.device("cuda", 1), 1), (None, None)])
def test_cuda_ms_runs_and_times_on_the_given_device(monkeypatch, device, entered):
    """With ``device`` the calls and both events run with that GPU current; without it on
    the current GPU (no device switch)."""
    current = [None]
    seen = []

    @contextlib.contextmanager
    def on(d):
        before, current[0] = current[0], torch.device(d).index
        yield
        current[0] = before

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            seen.append(current[0])

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 1.0

    monkeypatch.setattr(torch.cuda, "device", on)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    timed_choice.cuda_ms(lambda: seen.append(current[0]), reps=1, device=device)
    assert seen == [entered] * 4 and current == [None]


def test_no_timing_while_torch_compile_traces(monkeypatch):
    """Inside a torch.compile trace nothing runs, so even a real GPU tensor is not timed."""
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    t = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    assert timed_choice.can_time(t)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not timed_choice.can_time(t)


def test_timed_choices_is_a_copy_of_the_times(monkeypatch):
    """Changing what ``timed_choices`` returned does not change what a later reading says."""
    both = ("row_tiled", "warp_row")
    timed_choice.choose_timed("spmm", "p", both, {"row_tiled": 2.0, "warp_row": 1.0}.get)
    timed_choice.timed_choices()["spmm: p"]["ms"]["warp_row"] = 99.0
    assert timed_choice.timed_choices()["spmm: p"]["ms"] == {"row_tiled": 2.0, "warp_row": 1.0}


def test_calls_made_while_an_inner_op_is_timed_within_a_timing_are_not_uses(monkeypatch):
    """A candidate being timed may run an op that times its own candidates: calls of the
    outer candidate after the inner timing ended are still not uses."""
    timed_choice.register("inner", ("x", "y"), same_bits=True)

    def outer_ms(p):
        timed_choice.choose_timed("inner", p, ("x", "y"), {"x": 1.0, "y": 2.0}.get)
        timed_choice.record_use("spmm", p)
        return {"row_tiled": 2.0, "warp_row": 1.0}[p]

    assert timed_choice.choose_timed("spmm", "q", ("row_tiled", "warp_row"), outer_ms) == "warp_row"
    assert timed_choice.uses() == {}


def test_cuda_ms_waits_for_the_end_event_before_reading_the_time(monkeypatch):
    """The events are read only once the end event has completed (an unfinished event has no
    time to give): the one synchronisation comes after the last call and before the reading."""
    log: list[str] = []
    _logged_events(monkeypatch, log, 4.0)
    assert timed_choice.cuda_ms(lambda: log.append("call"), reps=1) == pytest.approx(4.0)
    assert log == ["call", "record", "call", "record", "synchronize", "read"]
