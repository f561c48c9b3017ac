"""Channel gating against channel union: the inference FLOPs of each (PruneTrain Sec. 4.2,
Fig. 5b-c and Fig. 6).

PruneTrain reconfigures a network with short-cut connections by **channel union**: the
channels of a residual stage's shared node are kept while any layer of the stage uses them,
so the first and last convolution of each residual path still compute on channels that are
zero for that layer. **Channel gating** instead gives every residual path select and scatter
layers, so each convolution computes only on its own dense input and output channels, at the
cost of the indexing (which the paper measures as slower, Fig. 7). This module counts what
each computes on the same trained model: union as the convolutions are (the model PruneTrain
reconfigured), gating with every convolution reduced to the input channels whose weights are
not all zero and the filters that are not all zero. It counts; it does not run gating.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


def dense_channels(weight: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the dense filters and of the dense input channels of a conv weight
    [F, C/g, R, S]: those with some nonzero ``|w| >= threshold``, the rule of the
    reconfiguration (PruneTrain Sec. 4.2 removes a channel whose weights are all below it);
    an all-zero channel is never dense, also at ``threshold=0``."""
    a = weight.detach().abs()
    alive = (a >= threshold) & (a > 0)
    idx_out = alive.flatten(1).any(dim=1).nonzero().flatten()
    idx_in = alive.transpose(0, 1).flatten(1).any(dim=1).nonzero().flatten()
    return idx_out, idx_in


def conv_flops_union_vs_gating(
    model: nn.Module, input_shape: Sequence[int], threshold: float = 1e-4
) -> dict[str, Any]:
    """Forward FLOPs per sample of every convolution of ``model`` under channel union and
    under channel gating (PruneTrain Sec. 4.2, Fig. 6).

    Args:
        model: a (reconfigured) CNN; its convolutions' weights define which channels are zero.
        input_shape: one sample's shape (C, H, W); the spatial size of each convolution's
            output is read off one forward pass of a zero input
            (:func:`impl.flops.training_flops`, which leaves BatchNorm statistics alone).
        threshold: a weight with ``|w| < threshold`` counts as zero (PruneTrain's 1e-4), as
            reconfiguration removes it; one equal to it counts as nonzero.

    Returns:
        ``union`` and ``gating`` (FLOPs per sample summed over convs, 2 per multiply-add),
        and ``layers``: per conv its name, channels computed under union (in, out) and under
        gating (in, out), and both FLOPs. Grouped convolutions count their channels per group
        as union and gating alike (gating applies to ordinary convolutions).

    Raises:
        ValueError: ``input_shape`` is not (C, H, W) or ``threshold`` is negative.
    """
    if len(input_shape) != 3 or any(int(s) < 1 for s in input_shape):
        raise ValueError(f"input_shape must be (C, H, W) with positive sizes, got {input_shape}")
    if not threshold >= 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    from impl.flops import training_flops

    convs = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    report = training_flops(model, tuple(int(s) for s in input_shape))  # one zero-input pass
    out_hw = {layer.name: tuple(layer.out_shape[-2:]) for layer in report.layers}
    layers = []
    union = gating = 0.0
    for name, conv in convs:
        if name not in out_hw:
            continue  # a conv the forward pass did not reach (e.g. a removed path)
        h, w = out_hw[name]
        r, s = conv.kernel_size
        per_out = 2.0 * r * s * h * w  # FLOPs per (output channel, input channel) pair
        f_all, c_per_group = conv.weight.shape[0], conv.weight.shape[1]
        if conv.groups != 1:
            f_dense, c_dense = f_all, c_per_group
        else:
            idx_out, idx_in = dense_channels(conv.weight, threshold)
            f_dense, c_dense = len(idx_out), len(idx_in)
        u = per_out * f_all * c_per_group
        g = per_out * f_dense * c_dense
        union += u
        gating += g
        layers.append({"name": name, "union_channels": (c_per_group, f_all),
                       "gating_channels": (c_dense, f_dense), "union_flops": u,
                       "gating_flops": g})  # fmt: skip
    return {"union": union, "gating": gating, "layers": layers}


class GatedConv(nn.Module):
    """A convolution under channel gating (PruneTrain Fig. 5b): select the dense input
    channels, convolve with the dense filters only, scatter the result into the full output
    channels (zeros elsewhere). Equal to the original convolution where the channels it
    drops have zero weights (and bias)."""

    def __init__(self, conv: nn.Conv2d, threshold: float = 1e-4) -> None:
        super().__init__()
        if conv.groups != 1:
            raise ValueError("channel gating applies to ordinary (groups=1) convolutions")
        idx_out, idx_in = dense_channels(conv.weight, threshold)
        self.out_channels = conv.out_channels
        self.register_buffer("idx_in", idx_in)
        self.register_buffer("idx_out", idx_out)
        self.inner = nn.Conv2d(
            len(idx_in), len(idx_out), conv.kernel_size, conv.stride, conv.padding,
            conv.dilation, bias=conv.bias is not None,
        ).to(conv.weight.device, conv.weight.dtype)  # fmt: skip
        with torch.no_grad():
            self.inner.weight.copy_(conv.weight[idx_out][:, idx_in])
            if conv.bias is not None:
                self.inner.bias.copy_(conv.bias[idx_out])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Select, convolve, scatter: [B, C, H, W] -> [B, F, H', W']."""
        y = self.inner(x.index_select(1, self.idx_in))
        out = y.new_zeros(y.shape[0], self.out_channels, *y.shape[2:])
        return out.index_copy_(1, self.idx_out, y)


__all__ = ["GatedConv", "conv_flops_union_vs_gating", "dense_channels"]
