"""TrainConfig.memory_format: the layout a run trains in, how "auto" resolves, and that
every method computes the same step in channels_last as in NCHW."""

from __future__ import annotations

import pytest
import test_distributed_worker as worker
import torch
from torch import nn

from impl import cli, rundir
from impl.config import SCALE_PRESETS, TrainConfig, resolve
from impl.methods import create_method, method_class, register_method, unregister_method
from impl.methods.dense import Dense
from impl.models import create
from impl.train import apply_memory_format, resolve_memory_format, train

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _four_d(model_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model_state.items() if v.dim() == 4}


def test_auto_is_channels_last_on_a_cpu_only_for_methods_measured_to_gain():
    gains = {"dense": True, "prunetrain": True, "campfire": True}
    for name in ("dense", "clicktrain", "prunetrain", "sdgp", "campfire"):
        method = create_method(name)
        want = "channels_last" if gains.get(name, False) else "contiguous"
        assert resolve_memory_format("auto", method, CPU) == want, name
        assert resolve_memory_format("auto", method, CUDA) == "contiguous", name
        for given in ("contiguous", "channels_last"):  # an explicit choice is taken as is
            assert resolve_memory_format(given, method, CPU) == given
    assert method_class("sdgp").channels_last_on_cpu is False


def test_apply_memory_format_moves_4d_tensors_in_place_and_says_whether_it_did():
    model = create("resnet20", num_classes=10, in_channels=3)
    params = list(model.parameters())
    conv = model.layer1[0].conv1.weight
    assert not conv.is_contiguous(memory_format=torch.channels_last)
    assert apply_memory_format(model, "channels_last") is True
    assert list(model.parameters()) == params  # the same Parameter objects: optimizers hold
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    assert conv.is_contiguous(memory_format=torch.channels_last)
    assert model.fc.weight.is_contiguous()  # 2-D tensors are left as they are
    assert apply_memory_format(model, "channels_last") is False
    assert apply_memory_format(model, "contiguous") is True and conv.is_contiguous()
    with pytest.raises(ValueError, match="memory_format"):
        apply_memory_format(model, "nhwc")


def test_config_rejects_an_unknown_layout_and_the_cpu_preset_asks_for_auto():
    with pytest.raises(ValueError, match="memory_format 'nhwc'"):
        TrainConfig(memory_format="nhwc").validate()
    assert SCALE_PRESETS["cpu"]["memory_format"] == "auto"
    assert resolve("smoke").memory_format == "contiguous"
    assert resolve("gpu").memory_format == "contiguous"
    args = cli._train_parser(None).parse_args(["--memory-format", "channels_last"])
    assert cli._resolve_from_args(args, {}).memory_format == "channels_last"
    assert (
        cli._resolve_from_args(cli._train_parser(None).parse_args([]), {}).memory_format == "auto"
    )
    with pytest.raises(SystemExit):
        cli._train_parser(None).parse_args(["--memory-format", "nhwc"])


class _RebuildsAConv(Dense):
    """Dense, but every epoch end replaces one conv with a new (NCHW) copy of itself, as
    PruneTrain's reconfiguration builds its smaller layers."""

    name = "test_rebuilds_a_conv"
    channels_last_on_cpu = True

    def on_epoch_end(self, ctx) -> None:
        old = ctx.model.layer3[2].conv2
        new = nn.Conv2d(old.in_channels, old.out_channels, 3, padding=1, bias=False)
        with torch.no_grad():
            new.weight.copy_(old.weight.contiguous())
        assert new.weight.is_contiguous()
        ctx.model.layer3[2].conv2 = new


@pytest.fixture
def rebuilding_method():
    register_method(_RebuildsAConv.name, _RebuildsAConv)
    yield _RebuildsAConv.name
    unregister_method(_RebuildsAConv.name)  # the registry is the process's: others list it


def test_the_trainer_lays_out_layers_a_method_rebuilt_and_records_the_layout(
    tmp_path, rebuilding_method
):
    cfg = resolve(
        "smoke",
        method=rebuilding_method,
        data="digits",
        epochs=2,
        threads=1,
        memory_format="auto",
        out=str(tmp_path / "run"),
    )
    summary = train(cfg, progress=False)
    assert summary["memory_format"] == "channels_last"
    state = rundir.load_checkpoint(tmp_path / "run")["model"]
    layouts = {
        k: v.is_contiguous(memory_format=torch.channels_last) for k, v in _four_d(state).items()
    }
    assert layouts and all(layouts.values()), layouts
    plain = train(
        resolve("smoke", data="digits", epochs=1, out=str(tmp_path / "nchw")), progress=False
    )
    assert plain["memory_format"] == "contiguous"


# the distributed tests' small settings: 8x8 synthetic images, a constant rate, no augmentation
STEP = dict(worker.SMOKE, lr=0.02, batch_size=32)
METHOD_STEPS = {
    "dense": dict(epochs=1, max_steps_per_epoch=1),
    # a step in each pattern phase, the last on pattern convolutions after the hard prune
    "clicktrain": dict(
        epochs=3,
        max_steps_per_epoch=1,
        method_options=worker.CLICKTRAIN["method_options"],
    ),
    "prunetrain": dict(epochs=1, max_steps_per_epoch=1),
    # random N:M selection: a magnitude ranking may keep the other of two near-equal
    # gradients when their last bits differ, a real but discrete difference
    "sdgp": dict(
        epochs=1,
        max_steps_per_epoch=1,
        method_options=dict(prune_method="random", profile=False),
    ),
    "campfire": dict(epochs=1, max_steps_per_epoch=1),
}


@pytest.mark.parametrize("method", sorted(METHOD_STEPS))
def test_each_method_takes_the_same_step_in_channels_last_as_in_nchw(method, tmp_path):
    # From the same initialisation one SGD step (ClickTrain: also one on pattern convs) ends
    # at the same weights up to float32 rounding: every op of the method reads the layout
    # by strides, none by assuming NCHW memory.
    states = {}
    for fmt in ("contiguous", "channels_last"):
        cfg = resolve(
            "smoke",
            method=method,
            memory_format=fmt,
            out=str(tmp_path / fmt),
            **STEP,
            **METHOD_STEPS[method],
        )
        summary = train(cfg, progress=False)
        assert summary["memory_format"] == fmt
        states[fmt] = rundir.load_checkpoint(tmp_path / fmt)["model"]
    cl = _four_d(states["channels_last"])
    assert cl and all(v.is_contiguous(memory_format=torch.channels_last) for v in cl.values())
    assert states["channels_last"].keys() == states["contiguous"].keys()
    assert worker.weights_rel_diff(tmp_path / "channels_last", tmp_path / "contiguous") < 1e-5
