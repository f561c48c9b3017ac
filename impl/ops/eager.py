"""Calling an op's implementation directly in plain eager calls, and its registered
``torch.library`` op everywhere else.

Every CUDA op is a ``torch.library.custom_op`` (docs/kernels.md), so that autograd,
``torch.compile``, fake tensors and the profiler see one op. In a plain eager call that needs
none of them, going through the dispatcher costs 25-35 us of host time a call on the 2-core
CPU machine (``grad_pack``: 54 us through the op, 29 us direct; ``grad_unpack_into``: 44 us
against 8 us), about as long as the kernel itself on an H200 for a 72 MiB gradient. The
sparse Allreduce packs and unpacks every bucket and SDGP prunes every convolution's output
gradient, each iteration, so that cost adds up on the host.

:func:`call` runs ``impl`` directly only when nothing would notice: not while torch.compile
traces, no ``TorchDispatchMode`` (fake tensors, functionalization), no ``torch.func`` transform
(``vmap``'s batched tensors have no storage for a kernel to read), no ``torch.jit.trace`` (which
records only the ops it sees), no ``TorchFunctionMode`` (a user's mode sees the op;
``torch.set_default_device`` installs one, so under it calls take the op's slower path) and no
profiler active, every tensor argument a plain ``torch.Tensor`` or ``nn.Parameter`` with storage
(a meta tensor goes to the op's fake implementation), and none that needs a gradient. A direct
call that writes into an argument bumps its version counter, as the op does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def direct_ok(args: Sequence[Any]) -> bool:
    """Whether an op may run its implementation directly on ``args`` (see the module
    docstring): True only in a plain eager call with plain tensors, none needing a gradient."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False
    if torch._C._functorch.peek_interpreter_stack() is not None:  # vmap, grad, jacrev, ...
        return False
    if torch._C._get_tracing_state() is not None or torch._C._is_torch_function_mode_enabled():
        return False
    if torch.autograd._profiler_enabled():
        return False
    grad = torch.is_grad_enabled()
    for a in args:
        if isinstance(a, torch.Tensor) and (
            type(a) not in _PLAIN or a.is_meta or (grad and a.requires_grad)
        ):
            return False
    return True


def call(
    op: Callable[..., Any], impl: Callable[..., Any], *args: Any, mutated: Sequence[int] = ()
) -> Any:
    """``impl(*args)`` where :func:`direct_ok` allows it, else ``op(*args)`` (the registered
    op, whose implementation is ``impl``). ``mutated``: the positions of the arguments the op
    writes into (its ``mutates_args``), whose version counters a direct call bumps. A dual
    tensor of forward-mode AD is refused (``NotImplementedError``): the op has no jvp, and
    would return no tangent rather than say so."""
    if fwAD._current_level >= 0 and any(
        isinstance(a, torch.Tensor) and fwAD.unpack_dual(a).tangent is not None for a in args
    ):  # the registered op would drop the tangent without a word
        raise NotImplementedError(
            f"{getattr(op, '__name__', op)}: the CUDA kernels have no forward-mode derivative "
            "(a dual tensor of torch.autograd.forward_ad); use reverse mode (backward, "
            "torch.autograd.grad)"
        )
    if not direct_ok(args):
        return op(*args)
    out = impl(*args)
    for i in mutated:
        torch.autograd.graph.increment_version(args[i])
    return out


__all__ = ["call", "direct_ok"]
