"""Configs: presets, JSON round trip, validation, and the learning-rate schedules."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from impl.config import TrainConfig, check_field_types, resolve
from impl.schedules import lr_multiplier


def test_resolve_applies_preset_then_explicit_values():
    cfg = resolve("smoke", epochs=5, model="resnet32")
    assert cfg.epochs == 5 and cfg.model == "resnet32"
    assert cfg.max_steps_per_epoch == 3  # from the smoke preset
    assert cfg.scale == "smoke"
    assert resolve("paper").data == "cifar10"


def test_config_round_trips_and_unknown_keys_are_errors():
    cfg = resolve("cpu", method="sdgp", method_options={"n": 2, "m": 8})
    again = TrainConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.digest() == cfg.digest()
    with pytest.raises(ValueError, match="unknown config keys"):
        TrainConfig.from_dict({**cfg.to_dict(), "evil": "__import__('os')"})


def test_digest_ignores_output_directory_but_not_seed():
    a = resolve("cpu", out="x")
    assert a.digest() == resolve("cpu", out="y").digest()
    assert a.digest() != resolve("cpu", seed=1).digest()


def test_digest_ignores_where_the_dataset_is_read_from_but_not_which_dataset():
    a = resolve("cpu", data="cifar10", data_dir="/data/a")
    assert a.digest() == resolve("cpu", data="cifar10", data_dir="/mnt/b").digest()
    assert a.digest() == resolve("cpu", data="cifar10").digest()
    assert a.digest() != resolve("cpu", data="cifar100", data_dir="/data/a").digest()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"epochs": 0}, "epochs"),
        ({"schedule": "zigzag"}, "schedule"),
        ({"lr": -1.0}, "lr"),
        ({"schedule": "step"}, "schedule 'step' needs milestones"),
        ({"schedule": "step", "milestones": [3, -1]}, r"milestones must be epochs >= 0"),
        ({"gamma": 0.0}, "gamma must be > 0"),
        ({"schedule": "step", "milestones": [15, 20]}, r"never changes the rate in 15 epochs"),
        ({"schedule": "step", "milestones": [3, 6, 3]}, r"^--milestones repeats epoch 3 \("),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"lr": float("nan")}, "lr must be > 0"),
        ({"warmup_fraction": 1.0}, r"warmup_fraction must be in \[0, 1\)"),
        ({"warmup_fraction": -0.1}, r"warmup_fraction must be in \[0, 1\)"),
        ({"threads": 0}, "threads must be >= 1"),
        ({"momentum": -0.5}, r"momentum must be in \[0, 1\)"),
        ({"momentum": 1.5}, r"momentum must be in \[0, 1\)"),  # trained to 9.6e6 and "finished"
        ({"label_smoothing": 1.0}, r"label_smoothing must be in \[0, 1\)"),
        ({"weight_decay": -1.0}, "weight_decay must be >= 0"),
        ({"label_smoothing": 2.0}, r"label_smoothing must be in \[0, 1\)"),
        ({"max_steps_per_epoch": 0}, "max_steps_per_epoch must be >= 1"),
        ({"max_steps_per_epoch": -1}, "max_steps_per_epoch must be >= 1"),
        ({"lr": float("inf")}, "lr must be > 0 and finite"),  # trained to NaN and "finished"
        ({"momentum": float("inf")}, r"momentum must be in \[0, 1\)"),
        ({"momentum": 1.0}, r"momentum must be in \[0, 1\)"),  # steps never decay
        ({"weight_decay": float("inf")}, "weight_decay must be >= 0 and finite"),
        ({"seed": 2**64}, r"^seed must be an integer from 0 to 18446744073709551615 \(2\*\*64"),
        ({"seed": -1}, r"^seed must be an integer from 0 to"),
    ],
    ids=[
        "epochs",
        "schedule",
        "lr",
        "step-without-milestones",
        "negative-milestone",
        "gamma",
        "milestones-past-the-end",
        "milestones-repeated",
        "batch-0",
        "lr-0",
        "lr-nan",
        "warmup-1",
        "warmup-neg",
        "threads-0",
        "momentum-neg",
        "momentum-1.5",
        "label-smoothing-1",
        "weight-decay-neg",
        "label-smoothing-2",
        "max-steps-0",
        "max-steps-neg",
        "lr-inf",
        "momentum-inf",
        "momentum-1",
        "weight-decay-inf",
        "seed-too-large",
        "seed-negative",
    ],  # fmt: skip
)
def test_bad_values_are_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        resolve("cpu", **kw)
    with pytest.raises(ValueError, match="scale"):
        resolve("huge")


def test_a_repeated_milestone_is_refused_and_their_order_does_not_matter(tmp_path, capsys):
    """A repeated milestone would multiply the rate by gamma twice at that epoch; milestones in
    any order give the same rate (the multiplier counts those passed)."""
    from impl import cli
    from impl.schedules import lr_multiplier

    argv = ["train", "--scale", "smoke", "--schedule", "step", "--milestones", "1", "1",
            "--no-progress", "--out", str(tmp_path / "run")]  # fmt: skip
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "error: --milestones repeats epoch 1 ([1, 1])" in err and "--gamma" in err
    for progress in (0.5, 2.5, 4.5):
        assert lr_multiplier("step", progress, 6, milestones=[4, 2]) == lr_multiplier(
            "step", progress, 6, milestones=[2, 4]
        )


def test_a_seed_out_of_torch_range_names_the_flag_before_training(tmp_path, capsys):
    """A seed over 2**64 - 1 failed once training began, in torch, naming no flag."""
    from impl import cli

    for flags in (["--seed", str(10**20)], ["--method", "sdgp", "--prune-seed", str(2**64)]):
        argv = ["train", "--scale", "smoke", "--no-progress", "--out", str(tmp_path / "r"), *flags]
        assert cli.main(argv) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert f"error: {flags[-2]} must be an integer from 0 to {2**64 - 1} (2**64 - 1)" in err
    assert resolve("cpu", seed=2**64 - 1).seed == 2**64 - 1  # the largest is accepted
    assert not list(tmp_path.iterdir())  # nothing was trained


def test_the_smallest_valid_values_are_accepted():
    cfg = resolve("cpu", epochs=1, batch_size=1, threads=1, schedule="step", milestones=[0])
    assert (cfg.epochs, cfg.batch_size, cfg.threads, cfg.milestones) == (1, 1, 1, [0])
    assert resolve("cpu", warmup_fraction=0.0).warmup_fraction == 0.0  # one-cycle's setting


def test_paper_preset_is_the_shared_cifar_recipe():
    """PruneTrain's CIFAR recipe (p. 7), which the papers share: 182 epochs of batch 128 at
    lr 0.1, divided by 10 from epochs 91 and 136 counted from 1, as the authors' code: after
    90 and 135 epochs done, the milestones."""
    cfg = resolve("paper")
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.schedule) == (182, 128, 0.1, "step")
    assert cfg.milestones == [90, 135] and cfg.gamma == pytest.approx(0.1)
    assert (resolve("cpu").epochs, resolve("smoke").epochs) == (15, 2)


def test_default_run_directory_names_method_model_data_scale_and_digest():
    cfg = resolve("cpu", method="sdgp", model="resnet32", data="digits")
    name = f"sdgp-resnet32-digits-cpu-{cfg.digest()}"
    assert cfg.default_out("runs") == f"runs/{name}" and len(cfg.digest()) == 12


def test_step_schedule_needs_only_one_milestone_inside_the_run():
    # Campfire's smoke timeline puts its last drop on the final epoch: still a step schedule.
    cfg = resolve("cpu", epochs=4, schedule="step", milestones=[1, 4])
    assert cfg.milestones == [1, 4]
    assert lr_multiplier("step", 1.5, 4, milestones=cfg.milestones) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="give --milestones below --epochs"):
        resolve("paper", epochs=50)  # the paper's drops after 90 and 135 would never come


def test_onecycle_rises_then_falls_to_zero():
    values = [lr_multiplier("onecycle", e, 10, warmup_fraction=0.2) for e in range(11)]
    assert values[0] == pytest.approx(0.04)
    assert values[2] == pytest.approx(1.0)
    assert values[-1] == pytest.approx(0.0)
    assert all(a <= b for a, b in zip(values[:3], values[1:3]))
    assert all(a >= b for a, b in zip(values[2:], values[3:]))
    # linear both ways: 0.04 + 0.96 t / 0.2 up, then (1 - t) / 0.8 down
    assert values[1] == pytest.approx(0.52) and values[5] == pytest.approx(0.625)
    assert lr_multiplier("onecycle", 0.5, 10, warmup_fraction=0.2) == pytest.approx(0.28)
    # without warm-up it starts at its peak
    assert lr_multiplier("onecycle", 0, 10, warmup_fraction=0.0) == 1.0


def test_step_and_cosine_schedules():
    assert lr_multiplier("step", 90.9, 182, milestones=[91, 136]) == 1.0
    assert lr_multiplier("step", 91, 182, milestones=[91, 136]) == pytest.approx(0.1)
    assert lr_multiplier("step", 140, 182, milestones=[91, 136]) == pytest.approx(0.01)
    assert lr_multiplier("cosine", 5, 10) == pytest.approx(0.5)
    cosine = [lr_multiplier("cosine", e, 8) for e in (0, 2, 6, 8, 9)]  # 9: past the end
    assert cosine == pytest.approx([1.0, (1 + 0.5**0.5) / 2, (1 - 0.5**0.5) / 2, 0.0, 0.0])
    assert lr_multiplier("constant", 3, 10) == 1.0


def test_schedule_clamps_progress_refuses_an_unknown_name_and_keeps_the_configs_default():
    from impl.config import TrainConfig

    # before the start reads as the start (a schedule never goes under its first value)
    assert lr_multiplier("onecycle", -1.0, 10) == lr_multiplier("onecycle", 0.0, 10) == 0.04
    assert lr_multiplier("cosine", -3.0, 10) == 1.0
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        lr_multiplier("linear", 1.0, 10)
    # the function's default warm-up is the config's (a caller of either gets one schedule)
    assert lr_multiplier("onecycle", 1.0, 10) == lr_multiplier(
        "onecycle", 1.0, 10, warmup_fraction=TrainConfig().warmup_fraction
    )
    assert lr_multiplier("onecycle", 2.0, 10) == pytest.approx(1.0)  # the peak at 20%


def test_digest_ignores_fields_at_their_default():
    # A config saved before a field existed reads back with that field's default: same run.
    cfg = resolve("cpu", method="sdgp")
    data = cfg.to_dict()
    data.pop("data_options")  # as if saved before data_options existed
    assert TrainConfig.from_dict(data).digest() == cfg.digest()
    assert resolve("cpu", data_options={"image_size": 64}).digest() != resolve("cpu").digest()


def test_digest_ignores_method_options_given_at_their_default():
    # {"connectivity": 0.75} is ClickTrain's default: the same run as no option at all.
    plain = resolve("cpu", method="clicktrain")
    explicit = resolve("cpu", method="clicktrain", method_options={"connectivity": 0.75})
    assert explicit.digest() == plain.digest()
    other = resolve("cpu", method="clicktrain", method_options={"connectivity": 0.55})
    assert other.digest() != plain.digest()
    # Only the default-valued entry drops out; the rest still defines the run.
    both = resolve("cpu", method="clicktrain",
                   method_options={"connectivity": 0.75, "penalty": 1e-3})  # fmt: skip
    assert both.digest() == resolve("cpu", method="clicktrain",
                                    method_options={"penalty": 1e-3}).digest()  # fmt: skip
    assert both.digest() != plain.digest()


def test_method_class_names_the_valid_methods_for_an_unknown_one():
    from impl.methods import METHODS, method_class

    assert method_class("dense").__name__ == "Dense"
    assert {method_class(name).__name__ for name in METHODS} >= {"ClickTrain", "PruneTrain"}
    with pytest.raises(ValueError, match="valid methods: dense"):
        method_class("magic")


def test_train_help_names_the_default_run_directory_as_it_is_made(capsys):
    from impl.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "runs/<method>-<model>-<data>-<scale>-<hash>" in text
    cfg = resolve("smoke", method="dense", model="resnet20", data="digits")
    assert cfg.default_out("runs") == f"runs/dense-resnet20-digits-smoke-{cfg.digest()}"


@pytest.mark.parametrize(
    ("given", "owner"),
    [
        ({"milestones": [1]}, "step"),
        ({"gamma": 0.5}, "step"),
        ({"warmup_fraction": 0.1, "schedule": "cosine"}, "onecycle"),
    ],
    ids=["milestones", "gamma", "warmup"],
)
def test_a_schedules_setting_given_for_another_schedule_is_refused(given, owner):
    # --milestones under the default one-cycle schedule was silently ignored
    with pytest.raises(ValueError, match=f"is a setting of schedule '{owner}'"):
        resolve("smoke", **given)
    own = {"schedule": owner} | ({"milestones": [1]} if owner == "step" else {})
    resolve("smoke", **(given | own))  # under its own schedule: accepted


def test_is_default_option_reads_the_methods_config():
    from impl.config import is_default_option

    assert is_default_option("sdgp", "n", 2) and is_default_option("sdgp", "m", 4)
    assert not is_default_option("sdgp", "n", 1)
    assert not is_default_option("sdgp", "no_such_option", None)  # unknown: not a default
    assert not is_default_option("no_such_method", "n", 2)


def test_check_seed_takes_torchs_range_and_names_the_setting():
    from impl.config import MAX_SEED, check_seed

    check_seed(0, "seed")
    check_seed(MAX_SEED, "prune_seed")
    for bad in (-1, MAX_SEED + 1, True, 1.0, "3"):
        with pytest.raises(ValueError, match=r"^prune_seed must be an integer from 0 to"):
            check_seed(bad, "prune_seed")


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("epochs", 2.5, "epochs must be an int, got 2.5"),
        ("batch_size", True, "batch_size must be an int, got True"),
        ("lr", "0.1", "lr must be a number, got '0.1'"),
        ("threads", 1.5, "threads must be an int or None, got 1.5"),
        ("augment", 1, "augment must be a bool, got 1"),
        ("milestones", [1.5], r"milestones must be a list of ints, got \[1.5\]"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_before_the_run_starts(field, value, said, tmp_path):
    # a float epoch count used to pass and fail inside training, config.json already written
    from impl.train import Trainer

    with pytest.raises(ValueError, match=said):
        Trainer(resolve("smoke", out=str(tmp_path / "run"), **{field: value}), progress=False)
    assert not (tmp_path / "run").exists()
    assert resolve("smoke", threads=None, lr=1, schedule="step", milestones=[1]).validate() is None


@pytest.mark.parametrize(
    ("method", "option", "value"),
    [("campfire", "window_fraction", "0.8"), ("prunetrain", "penalty_ratio", "0.2"),
     ("clicktrain", "connectivity", "0.75"), ("sdgp", "n", 2.0)],
)  # fmt: skip
def test_a_method_option_of_the_wrong_type_is_refused_naming_it(method, option, value):
    from impl.methods import create_method

    with pytest.raises(ValueError, match=f"method {method!r}: option {option} must be"):
        create_method(method, {option: value})


def test_field_types_are_read_from_resolved_annotations_too():
    # a plug-in's Config written without `from __future__ import annotations`
    import dataclasses
    from typing import Optional

    # its annotations are type objects, not the text this module's own annotations are
    Config = dataclasses.make_dataclass(
        "Config",
        [("rate", float, 0.5), ("cap", Optional[int], None),  # noqa: UP045 - under test
         ("steps", list[int], dataclasses.field(default_factory=list))],
    )  # fmt: skip
    for given, said in (({"rate": "0.5"}, "rate must be a number"),
                        ({"cap": 2.5}, "cap must be an int or None"),
                        ({"steps": (1.5,)}, "steps must be a list of ints")):  # fmt: skip
        with pytest.raises(ValueError, match=said):
            check_field_types(Config, given)
    check_field_types(Config, {"rate": 1, "cap": None, "steps": [2]})
    check_field_types(Config(cap=3))
    # None only where the annotation allows it
    for field in ("rate", "steps"):
        with pytest.raises(ValueError, match=f"{field} must be .*, got None"):
            check_field_types(Config, {field: None})
    from impl.config import TrainConfig

    with pytest.raises(ValueError, match="epochs must be an int, got None"):
        TrainConfig(epochs=None).validate()  # (resolve reads None as "the scale's default")


def test_read_config_names_the_file_of_a_value_it_refuses(tmp_path):
    """A config.json edited to "epochs": "six" said "epochs must be an int" naming no file."""
    from impl.config import TrainConfig, read_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TrainConfig().to_dict(), "epochs": "six"}))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: epochs must be an int"):
        read_config(path)
    path.write_text(json.dumps(TrainConfig().to_dict()))
    assert read_config(path) == TrainConfig()


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"lr": True}, "lr must be a number, got True"),
        ({"milestones": [1, True]}, r"milestones must be a list of ints, got \[1, True\]"),
        ({"data_options": []}, r"data_options must be a dict, got \[\]"),
        ({"seed": None}, "seed must be an int, got None"),
    ],
    ids=["bool-rate", "bool-milestone", "list-options", "none-seed"],
)
def test_field_types_refuse_bools_for_numbers_and_check_dicts(values, said):
    """A bool is not a number here, a dict field takes only a dict, and None only where the
    field allows it."""
    with pytest.raises(ValueError, match=said):
        check_field_types(TrainConfig, values)


def test_field_types_take_tuples_of_ints_and_leave_wider_unions_unchecked():
    """A tuple of ints is a list of ints; an annotation of several types is not checked."""
    check_field_types(TrainConfig, {"milestones": (1, 2), "threads": None, "out": None})
    Config = dataclasses.make_dataclass("Config", [("either", int | str | None, None)])
    check_field_types(Config, {"either": "x"})
    check_field_types(Config, {"either": 1.5})


def test_validate_refuses_an_unknown_scale():
    """A config read back with a scale no preset has is refused by validate itself."""
    with pytest.raises(ValueError, match="unknown scale 'huge'; valid scales: smoke, cpu"):
        TrainConfig(scale="huge").validate()


@pytest.mark.parametrize(
    "values",
    [
        {"warmup_start": 0.0},
        {"warmup_start": 1.0},
        {"weight_decay": 0.0},
        {"momentum": 0.0},
        {"label_smoothing": 0.0},
        {"max_steps_per_epoch": 1},
    ],
    ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()),
)
def test_the_edges_of_the_valid_ranges_are_accepted(values):
    """Closed ends of the ranges: warm-up from 0 or from the peak itself, no weight decay,
    no momentum, no smoothing, one step per epoch."""
    cfg = resolve("cpu", **values)
    assert all(getattr(cfg, k) == v for k, v in values.items())


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"warmup_start": -0.1}, r"warmup_start must be in \[0, 1\]"),
        ({"warmup_start": 1.5}, r"warmup_start must be in \[0, 1\]"),
        ({"bf16": True, "fp16": True}, "bf16 and fp16 exclude each other"),
    ],
    ids=["warmup-start-neg", "warmup-start-1.5", "bf16-and-fp16"],
)
def test_validate_refuses_a_warm_up_start_outside_zero_to_one_and_two_autocasts(values, said):
    with pytest.raises(ValueError, match=said):
        TrainConfig(**values).validate()


def test_resolve_reads_none_as_the_presets_value_and_an_empty_list_as_no_milestones():
    """An override of None leaves the scale's value; milestones=[] (clearing them) is no
    step-schedule setting, so the one-cycle schedule accepts it."""
    cfg = resolve("smoke", epochs=None, batch_size=None, max_steps_per_epoch=None)
    assert (cfg.epochs, cfg.batch_size, cfg.max_steps_per_epoch) == (2, 32, 3)
    assert resolve("smoke", milestones=[]).milestones == []
    with pytest.raises(ValueError, match="warmup_start is a setting of schedule 'onecycle'"):
        resolve("smoke", schedule="cosine", warmup_start=0.5)


def test_the_smoke_and_cpu_presets():
    """smoke: 2 epochs of 3 steps of batch 32, evaluated in batches of 256; cpu: 15 epochs of
    batch 128, the memory format chosen per method ("auto"); gpu: 30 epochs."""
    smoke = resolve("smoke")
    assert (smoke.epochs, smoke.batch_size, smoke.max_steps_per_epoch) == (2, 32, 3)
    assert smoke.eval_batch_size == 256 and smoke.memory_format == "contiguous"
    cpu = resolve("cpu")
    assert (cpu.epochs, cpu.batch_size, cpu.memory_format) == (15, 128, "auto")
    assert cpu.max_steps_per_epoch is None and cpu.eval_batch_size == 512
    assert (resolve("gpu").epochs, resolve("gpu").memory_format) == (30, "contiguous")


def test_digest_keeps_an_unknown_method_option_even_when_it_is_none():
    """Only options equal to the method's default drop out of the digest: an option the
    method does not have defines the run, whatever its value."""
    plain = resolve("cpu", method="clicktrain")
    odd = resolve("cpu", method="clicktrain", method_options={"no_such_option": None})
    assert odd.digest() != plain.digest()


def test_field_types_fall_back_to_the_annotations_text_where_it_does_not_resolve():
    """Where a dataclass's annotations do not resolve, their text is read: "int | None"
    takes None and refuses a float; a type unknown here is not checked."""
    Config = dataclasses.make_dataclass(
        "Config", [("cap", "int | None", None), ("thing", "NoSuchType", None)]
    )
    check_field_types(Config, {"cap": None, "thing": object()})
    check_field_types(Config, {"cap": 3})
    with pytest.raises(ValueError, match=r"cap must be an int or None, got 2.5 \(float\)"):
        check_field_types(Config, {"cap": 2.5})


def test_the_default_recipe_is_one_cycle_nesterov_sgd_and_the_paper_preset_plain_momentum():
    """The cpu preset trains as docs/clicktrain.md states (batch 128, lr 0.2 one-cycle
    warmed up over 20% of training from 0.04 of the peak (the DAWNBench recipes'), SGD with
    Nesterov momentum 0.9, weight decay 5e-4); the gpu preset keeps batch 128; the paper
    preset is the authors' PruneTrain code: plain momentum, no Nesterov."""
    cpu = resolve("cpu")
    assert (cpu.batch_size, cpu.lr, cpu.schedule) == (128, 0.2, "onecycle")
    assert (cpu.warmup_fraction, cpu.warmup_start) == (0.2, 0.04)
    assert (cpu.momentum, cpu.nesterov, cpu.weight_decay) == (0.9, True, 5e-4)
    assert resolve("gpu").batch_size == 128
    paper = resolve("paper")
    assert (paper.momentum, paper.nesterov) == (0.9, False)
