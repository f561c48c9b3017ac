"""impl.ops.eager: an op's implementation called directly only in plain eager calls."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode

from impl.ops import eager


class _Subclass(torch.Tensor):
    pass


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_plain_tensors_and_parameters_go_direct():
    x = torch.ones(3)
    assert eager.direct_ok([x, 2, None, torch.nn.Parameter(torch.ones(2), requires_grad=False)])


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(3, requires_grad=True),
        lambda: torch.nn.Parameter(torch.ones(3)),
        lambda: torch.ones(3, device="meta"),
        lambda: torch.ones(3).as_subclass(_Subclass),
    ],
    ids=["requires-grad", "parameter-with-grad", "meta", "subclass"],
)
def test_a_tensor_autograd_or_a_fake_path_needs_goes_through_the_op(make):
    assert not eager.direct_ok([torch.ones(2), make()])


def test_no_grad_lets_a_tensor_that_requires_grad_go_direct():
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        assert eager.direct_ok([x])


def test_a_dispatch_mode_or_the_profiler_sends_calls_through_the_op():
    x = torch.ones(3)
    with FakeTensorMode():
        assert not eager.direct_ok([x])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert not eager.direct_ok([x])
    assert eager.direct_ok([x])


def test_a_torch_func_transform_sends_calls_through_the_op():
    """Under vmap a tensor argument is a batched view with no storage: a kernel launched on
    it directly would fail on its data pointer, where the op says vmap is unsupported."""
    seen = []

    def fn(x):
        seen.append(eager.direct_ok([x]))
        return x * 2

    torch.vmap(fn)(torch.ones(2, 3))
    torch.func.grad(lambda x: fn(x).sum())(torch.ones(3))
    assert seen == [False, False]
    assert eager.direct_ok([torch.ones(3)])


def test_jit_trace_and_a_torch_function_mode_see_the_op():
    """torch.jit.trace records only the ops it sees (a direct kernel launch would leave an
    empty output in the graph), and a user's TorchFunctionMode must see the op too."""
    seen = []

    def fn(x):
        seen.append(eager.direct_ok([x]))
        return x * 2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's own notes on a Python list append
        torch.jit.trace(fn, torch.ones(3), check_trace=False)
    with _PassThrough():
        fn(torch.ones(3))
    assert seen == [False, False]
    assert eager.direct_ok([torch.ones(3)])


def test_torch_compile_traces_the_op():
    seen = []

    def fn(x):
        seen.append(eager.direct_ok([x]))
        return x + 1

    torch.compile(fn, backend="eager")(torch.ones(3))
    assert seen == [False]


def test_call_runs_the_implementation_or_the_op_and_bumps_what_it_writes():
    ran = []

    def op(out, v):
        ran.append("op")
        out.data.fill_(v)

    def impl(out, v):
        ran.append("impl")
        out.data.fill_(v)  # as a kernel writes: no version bump of its own

    out = torch.zeros(2)
    before = out._version
    eager.call(op, impl, out, 3.0, mutated=(0,))
    assert ran == ["impl"] and out.tolist() == [3.0, 3.0]
    assert out._version == before + 1
    eager.call(op, impl, torch.zeros(2, requires_grad=True), 1.0)
    assert ran == ["impl", "op"]


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_dual_tensor_of_forward_mode_ad_is_refused_not_given_no_tangent():  # torch's warning
    import torch.autograd.forward_ad as fwAD

    def op(x):
        return x * 2  # stands for a kernel: no tangent of its own

    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.ones(3), torch.ones(3))
        with pytest.raises(NotImplementedError, match="no forward-mode derivative"):
            eager.call(op, op, dual)
        assert eager.call(op, op, torch.ones(3)).tolist() == [2.0, 2.0, 2.0]

        def product(a, b):
            return a * b

        # one dual among plain operands (the values dual, the dense operand not) is refused too
        with pytest.raises(NotImplementedError, match="no forward-mode derivative"):
            eager.call(product, product, torch.ones(3), dual)


@pytest.mark.parametrize("through_op", [False, True], ids=["direct", "through-op"])
@pytest.mark.slow
def test_host_overhead_script_times_every_call(through_op):
    """scripts/host_overhead.py runs on a CPU machine (launch stubbed) and prints one time
    per call, in either mode."""
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(root / "scripts" / "host_overhead.py"), "--calls", "2"]
    done = subprocess.run(
        cmd + (["--through-op"] if through_op else []),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 5
    assert all(line.endswith(" us") and float(line.split()[-2]) > 0 for line in lines)


def test_a_direct_call_bumps_the_version_of_each_argument_it_writes_and_no_other():
    """``mutated`` names argument positions: a kernel writing its second and third
    arguments bumps those two version counters, not the first argument's."""
    a, b, c = torch.zeros(2), torch.zeros(2), torch.zeros(2)
    before = [t._version for t in (a, b, c)]

    def impl(x, y, z, v):
        y.data.fill_(v)
        z.data.fill_(v)

    eager.call(impl, impl, a, b, c, 1.0, mutated=(1, 2))
    assert [t._version - v for t, v in zip((a, b, c), before, strict=True)] == [0, 1, 1]


def test_forward_mode_ad_leaves_plain_calls_with_non_tensor_arguments_alone():
    """Under a forward-mode AD level, a call with no dual tensor runs as usual, numbers
    and None among its arguments included; a dual one is refused with the op's name."""
    import torch.autograd.forward_ad as fwAD

    def scale(x, k, out):
        return x * k

    with fwAD.dual_level():
        assert eager.call(scale, scale, torch.ones(2), 3, None).tolist() == [3.0, 3.0]
        dual = fwAD.make_dual(torch.ones(2), torch.ones(2))
        with pytest.raises(NotImplementedError, match="^scale: the CUDA kernels have no"):
            eager.call(scale, scale, dual, 3, None)
