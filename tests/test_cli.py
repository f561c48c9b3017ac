"""The command line: usage errors are one line and exit status 2; method flags exist."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re

import pytest
import torch

from impl import cli
from impl.methods.base import MethodConfig


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "--model", "resnet999"], "valid models: resnet20"),
        (["train", "--method", "magic"], "valid methods: dense"),
        (["train", "--data", "mnist60k"], "valid datasets: digits"),
        (["frobnicate"], "valid: reproduce, report, train"),
    ],
    ids=["model", "method", "data", "command"],
)
def test_unknown_name_is_one_line_listing_valid_names_exit_2(argv, needle, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err
    assert len(err.splitlines()) == 1
    assert re.match(r"pdtbench( \w+)?: error: ", err)  # the README's form of a usage error


def test_an_unknown_model_or_dataset_is_quoted_as_typed():
    with pytest.raises(cli.UsageError, match=r"^unknown model 'ResNet20'; valid models: resnet20"):
        cli._checked_config(cli._train_parser(None).parse_args(["--model", "ResNet20"]), None)
    with pytest.raises(cli.UsageError, match=r"^unknown dataset 'mnist'; valid datasets: digits"):
        cli._checked_config(cli._train_parser(None).parse_args(["--data", "mnist"]), None)


def test_resume_of_a_directory_that_is_not_a_run_exits_2(tmp_path, capsys):
    assert cli.main(["train", "--resume", str(tmp_path)]) == 2
    assert f"{tmp_path} is not a run directory (it has no config.json)" in capsys.readouterr().err
    # a path that is not there says so, in eval-fgsm's words
    for command in (["train", "--resume"], ["eval-fgsm"]):
        assert cli.main([*command, str(tmp_path / "nope")]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / 'nope'} is not a run directory (it does not exist)" in err


def test_resume_of_a_file_says_it_is_not_a_directory(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text("{}")
    for command in (["train", "--resume"], ["eval-fgsm"]):
        assert cli.main([*command, str(config)]) == 2
        err = capsys.readouterr().err
        assert f"{config} is not a run directory (it is a file, not a directory)" in err


def test_an_unknown_option_of_a_named_method_points_at_that_methods_help(tmp_path, capsys):
    """A method's options are listed by ``pdtbench train --method M --help`` only: an
    option of another method, or a bad value of one of its own, points there."""
    out = tmp_path / "run"
    bad_value = ["--method", "sdgp", "--n", "two"]
    for given, said in [
        (["--method", "clicktrain", "--pattern-count", "0"],
         "unrecognized arguments: --pattern-count 0"),
        (bad_value, "argument --n: invalid int value: 'two'"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            cli.main(["train", *given, "--out", str(out)])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("pdtbench train: error: ") and said in err
        assert err.rstrip().endswith(f"(see pdtbench train --method {given[1]} --help)")
    with pytest.raises(SystemExit):  # dense has no options of its own: the plain help
        cli.main(["train", "--pattern-count", "0", "--out", str(out)])
    assert "(see pdtbench train --help)" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # so too with --method dense named
        cli.main(["train", "--method", "dense", "--pattern-count", "0", "--out", str(out)])
    assert "(see pdtbench train --help)" in capsys.readouterr().err
    assert not out.exists()


def test_method_config_fields_become_flags():
    @dataclasses.dataclass
    class Cfg(MethodConfig):
        penalty_ratio: float = 0.2
        reconfig_interval: int = 10
        dynamic_batch: bool = False
        mask: str = "combined"
        fixed_epoch: int | None = None
        sizes: tuple[int, ...] = (4, 8)

    parser = argparse.ArgumentParser()
    names = cli.add_method_arguments(parser, Cfg)
    assert names == [f.name for f in dataclasses.fields(Cfg)]
    args = parser.parse_args(
        ["--penalty-ratio", "0.3", "--dynamic-batch", "true", "--fixed-epoch", "7",
         "--sizes", "4", "12"]
    )  # fmt: skip
    assert args.method__penalty_ratio == 0.3
    assert args.method__dynamic_batch is True
    assert args.method__fixed_epoch == 7
    assert args.method__sizes == [4, 12]
    assert args.method__mask is None  # unset flags leave the method's default in force
    shown = " ".join(parser.format_help().split())
    assert "--penalty-ratio PENALTY_RATIO" in shown and "--dynamic-batch BOOL" in shown
    with pytest.raises(SystemExit):  # a list option takes one value at least
        parser.parse_args(["--sizes"])


def test_a_method_field_of_several_types_is_read_as_text():
    @dataclasses.dataclass
    class Cfg(MethodConfig):
        budget: int | str | None = None

    parser = argparse.ArgumentParser()
    cli.add_method_arguments(parser, Cfg)
    assert parser.parse_args(["--budget", "half"]).method__budget == "half"


def test_none_is_refused_for_an_optional_number_whose_default_is_a_number(capsys):
    """Only an option whose default is None takes "none" (its help says "(default: None)");
    for one with a number as its default, "none" is no value."""

    @dataclasses.dataclass
    class Cfg(MethodConfig):
        window: int | None = 5

    parser = argparse.ArgumentParser()
    cli.add_method_arguments(parser, Cfg)
    assert parser.parse_args(["--window", "3"]).method__window == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--window", "none"])
    assert "invalid int value: 'none'" in capsys.readouterr().err


def test_reproduce_lists_every_paper_target(capsys):
    assert cli.main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for target in ("sdgp.table1", "clicktrain.table1", "prunetrain.table1", "cross.methods"):
        assert target in out


def test_help_lists_the_commands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    described = [line.split()[0] for line in out.splitlines()[1:]]
    assert described == ["train", "demo", "env", "eval-fgsm", "reproduce", "report"]


@pytest.mark.slow
def test_installed_console_script_reaches_every_subcommand_from_any_directory(tmp_path):
    """`pdtbench` as installed (not `python -m` from the checkout) finds impl, reproductions
    and the report: an install that maps a package wrong fails here, not in a user's hands."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).with_name("pdtbench")
    if not script.exists():
        script = shutil.which("pdtbench")
    assert script, "the pdtbench console script is not installed beside this Python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    outputs = {}
    for argv in (["reproduce", "--list"], ["demo", "--help"], ["report", "--help"]):
        proc = subprocess.run([str(script), *argv], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, f"pdtbench {' '.join(argv)}:\n{proc.stderr[-2000:]}"
        outputs[argv[0]] = proc.stdout
    assert "cross.methods" in outputs["reproduce"]


@pytest.mark.parametrize("command", ["train", "reproduce", "demo"])
def test_scale_help_says_what_each_scale_is_and_the_default(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "smoke: seconds, for tests; cpu: digits and small models" in text
    assert "(default: cpu)" in text
    if command != "demo":
        assert "gpu: one GPU, deeper models on digits for longer" in text


def test_train_image_size_flag_reaches_the_config_and_the_data(tmp_path):
    import json

    out = tmp_path / "run"
    argv = ["train", "--method", "dense", "--scale", "smoke", "--image-size", "16",
            "--threads", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    cfg = json.loads((out / "config.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert cfg["data_options"] == {"image_size": 16}
    # ResNet-20's FLOPs scale with the pixels: 16x16 is a quarter of the default 32x32.
    assert 0.2 < summary["inference_flops"] / 82_040_074 < 0.3


@pytest.mark.parametrize("flag", [True, False], ids=["tf32", "default"])
def test_train_tf32_flag_sets_both_flags_for_the_run_and_its_provenance(tmp_path, flag):
    """--tf32 turns TF32 on for float32 matmuls and cuDNN convolutions for the run; without
    it both are off, whatever torch's default (cuDNN's is on), so that dense convolutions
    are not timed on tensor cores against kernels without them. The run's environment says
    which, and the caller's settings are back afterwards."""
    import json

    import torch

    out = tmp_path / "run"
    argv = ["train", "--method", "dense", "--scale", "smoke", "--threads", "1",
            "--no-progress", "--out", str(out)]  # fmt: skip
    argv += ["--tf32"] if flag else []
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not flag
    try:
        assert cli.main(argv) == 0
        assert torch.backends.cuda.matmul.allow_tf32 is (not flag)
        assert torch.backends.cudnn.allow_tf32 is (not flag)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    cfg = json.loads((out / "config.json").read_text())
    env = json.loads((out / "summary.json").read_text())["environment"]
    assert cfg["tf32"] is flag
    assert env["tf32_matmul"] is flag and env["tf32_cudnn"] is flag


@pytest.mark.parametrize("flag", [True, False], ids=["cudnn-benchmark", "default"])
def test_train_cudnn_benchmark_flag_sets_the_mode_and_its_provenance(tmp_path, flag):
    """--cudnn-benchmark reaches the config, switches torch's cuDNN benchmark mode for the
    run (the run's recorded environment says so; without it the mode is off), and the
    caller's mode is back afterwards."""
    import json

    import torch

    out = tmp_path / "run"
    argv = ["train", "--method", "dense", "--scale", "smoke", "--threads", "1",
            "--no-progress", "--out", str(out)]  # fmt: skip
    argv += ["--cudnn-benchmark"] if flag else []
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = not flag
    try:
        assert cli.main(argv) == 0
        assert torch.backends.cudnn.benchmark is (not flag)
    finally:
        torch.backends.cudnn.benchmark = before
    cfg = json.loads((out / "config.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert cfg["cudnn_benchmark"] is flag
    assert summary["environment"]["cudnn_benchmark"] is flag


@pytest.mark.parametrize("nproc", ["1", "2"], ids=["1-process", "2-processes"])
@pytest.mark.parametrize("scale", ["gpu", "paper"], ids=str)
def test_train_refuses_a_gpu_scale_that_would_run_on_the_cpu(tmp_path, capsys, scale, nproc):
    """Refused once, before any worker is launched, and before anything is written."""
    out = tmp_path / "run"
    argv = ["train", "--method", "dense", "--scale", scale, "--device", "cpu", "--no-progress",
            "--nproc", nproc, "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"--scale {scale} times and trains on a CUDA GPU and --device cpu is not one" in err
    assert not out.exists(), "nothing is written for a refused run"


def test_train_refuses_one_gpu_index_for_several_processes(tmp_path, capsys, monkeypatch):
    """--device cuda:1 --nproc 2 would put both processes on one GPU (NCCL then fails at its
    start with a duplicate-GPU error): refused before any worker starts."""
    from impl import distributed

    monkeypatch.setattr(distributed, "launch", lambda *a, **k: pytest.fail("a job started"))
    out = tmp_path / "run"
    argv = ["train", "--method", "dense", "--scale", "smoke", "--device", "cuda:1",
            "--no-progress", "--nproc", "2", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--device cuda:1 with --nproc 2 would put every process on that one GPU" in err
    assert "give --device cuda" in err and not out.exists()


def test_train_refuses_more_processes_than_the_node_has_gpus(tmp_path, capsys, monkeypatch):
    """--nproc 16 on 8 GPUs put two ranks on each GPU, which NCCL refuses after the job has
    started: refused once, before any worker starts."""
    from impl import distributed

    monkeypatch.setattr(distributed, "launch", lambda *a, **k: pytest.fail("a job started"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    out = tmp_path / "run"
    argv = ["train", "--method", "dense", "--scale", "smoke", "--device", "cuda",
            "--no-progress", "--nproc", "16", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--nproc 16: 16 processes on this node need a CUDA GPU each (NCCL)" in err
    assert "it shows 8: run at most 8 per node" in err and not out.exists()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no CUDA: as one process
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--device 'cuda': this torch" in err and "use --device cpu or auto" in err
    assert "run at most" not in err and not out.exists()


def test_train_schedule_flags_reach_the_config(tmp_path):
    """--nesterov/--no-nesterov, --gamma and --warmup-fraction set their TrainConfig fields
    (the presets' values otherwise)."""
    import json

    out = tmp_path / "run"
    argv = ["train", "--method", "dense", "--scale", "smoke", "--threads", "1", "--no-progress",
            "--schedule", "step", "--milestones", "1", "--gamma", "0.5", "--no-nesterov",
            "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["gamma"], cfg["nesterov"]) == (0.5, False)
    assert cfg["schedule"] == "step" and cfg["milestones"] == [1]
    # one-cycle's own setting (under another schedule it is refused: test_config)
    parser = cli._train_parser(None)
    args = parser.parse_args(["--scale", "smoke", "--warmup-fraction", "0.1"])
    assert cli._resolve_from_args(args, {}).warmup_fraction == 0.1


def test_train_names_the_method_that_owns_a_foreign_option(capsys):
    argv = ["train", "--method", "dense", "--final-sparsity", "0.5", "--no-progress"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--final-sparsity is an option of --method campfire, not of --method dense" in err
    assert cli._other_methods_options(["--typo-flag", "1"], "dense") == ""


def test_every_foreign_option_is_named_also_when_written_with_an_equals_sign():
    message = cli._other_methods_options(["--final-sparsity=0.5", "--m", "4"], "dense")
    assert message.split("; ") == [
        "--final-sparsity is an option of --method campfire, not of --method dense",
        "--m is an option of --method sdgp, not of --method dense",
    ]


@pytest.mark.parametrize("flag", ["--m", "--n"])
def test_sdgps_short_options_under_another_method_name_their_owner(capsys, flag):
    # argparse took --m for an abbreviation ("ambiguous option: --m could match --method,
    # --model, --momentum"); abbreviations are off, so the owner is named
    assert cli.main(["train", "--scale", "smoke", flag, "4", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} is an option of --method sdgp, not of --method dense" in err


def test_train_takes_no_abbreviated_flag(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:  # argparse's usage error: --epochs spelled out
        cli.main([*SMOKE, "--epoch", "2", "--out", str(out)])
    assert exc.value.code == 2
    assert "unrecognized arguments: --epoch 2" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_sdgp_m_flag_is_not_taken_for_an_abbreviated_method(tmp_path):
    import json

    out = tmp_path / "run"
    argv = ["train", "--method", "sdgp", "--m", "8", "--n", "2", "--scale", "smoke",
            "--threads", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["method"] == "sdgp" and cfg["method_options"]["m"] == 8


def test_version_prints_the_package_version(capsys):
    from pathlib import Path

    import tomllib

    pyproject = tomllib.loads((Path(cli.__file__).parents[1] / "pyproject.toml").read_text())
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pdtbench {pyproject['project']['version']}"


def test_env_prints_the_machine_as_json_and_as_a_table(capsys):
    import json

    assert cli.main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["torch"] == __import__("torch").__version__
    assert cli.main(["env"]) == 0
    table = capsys.readouterr().out
    assert info["torch"] in table
    # torch's own TF32 default (cuDNN on) is shown with what a run does with it
    assert table.rstrip().endswith(cli.ENV_FLAGS_NOTE) and "off unless given" in table
    from impl.ops import nm_cpu

    want = "compiled kernel" if nm_cpu.is_available() else "torch reference"
    assert info["nm_prune_cpu"].startswith(want)
    from impl.ops import pattern_cpu

    want = "compiled kernel" if pattern_cpu.is_available() else "torch reference"
    assert info["pattern_conv_cpu"].startswith(want)
    for key, source, module in (("nm_prune_cpu", "nm_prune.c", nm_cpu),
                                ("pattern_conv_cpu", "pattern_conv.c", pattern_cpu)):  # fmt: skip
        if module.is_available():  # each names its own source
            assert info[key] == f"compiled kernel (impl/cpu/{source})"


def test_env_says_the_reference_prunes_when_the_kernel_is_off(capsys, monkeypatch):
    import json

    monkeypatch.setenv("PDT_CPU_KERNELS", "0")
    assert cli.main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["nm_prune_cpu"] == "torch reference: turned off by PDT_CPU_KERNELS=0"
    assert info["pattern_conv_cpu"] == "torch reference: turned off by PDT_CPU_KERNELS=0"


@pytest.mark.slow
def test_train_then_eval_fgsm_then_report_on_the_run(tmp_path, capsys):
    run = tmp_path / "runs" / "dense"
    argv = ["train", "--method", "dense", "--model", "resnet20", "--data", "digits"]
    assert cli.main([*argv, "--scale", "smoke", "--out", str(run), "--threads", "1"]) == 0
    capsys.readouterr()

    assert cli.main(["eval-fgsm", str(run), "--eps", "0", "0.1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(": ")[1] for line in lines] == ["eps 0", "eps 0.1"]
    top1 = [float(line.rsplit(" ", 1)[1].rstrip("%")) for line in lines]
    assert 0.0 <= top1[1] <= top1[0] <= 100.0
    import json

    assert json.loads((run / "fgsm.json").read_text())["device"] == "cpu"  # auto, no GPU here
    if not torch.cuda.is_available():  # a device this machine lacks: one line, exit 2
        assert cli.main(["eval-fgsm", str(run), "--device", "cuda"]) == 2
        assert "CUDA" in capsys.readouterr().err

    out = tmp_path / "html"
    assert cli.main(["report", str(tmp_path / "runs"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "0 results, 1 complete runs, 0 incomplete" in printed
    pages = "".join(p.read_text() for p in out.glob("*.html"))
    assert "complete runs, each with its scale" in pages  # the run table
    assert pages.count("data:image/png;base64,") >= 2  # top-1 per method, top-1 per epoch


def test_field_help_reads_each_fields_args_entry_with_its_continuation_lines():
    @dataclasses.dataclass
    class Demo(MethodConfig):
        """Options.

        Args:
            alpha: the first
                line and its continuation.
            beta: the second.

        Returns nothing, and this is not a field.
        """

        alpha: float = 1.0
        beta: int = 2

    assert cli.field_help(Demo) == {
        "alpha": "the first line and its continuation.",
        "beta": "the second.",
    }


def test_plain_help_turns_docstring_markup_into_terminal_text():
    text = "uses :func:`conv_grad` and :class:`~impl.X`, ``n <= m`` at 50% (:mod:`impl.data`)"
    assert cli.plain_help(text) == "uses conv_grad and impl.X, n <= m at 50%% (impl.data)"


@pytest.mark.parametrize("method", [None, "dense", "clicktrain", "prunetrain", "sdgp", "campfire"])
def test_train_help_shows_no_docstring_markup(method, capsys):
    argv = ["train", "--help"] if method is None else ["train", "--method", method, "--help"]
    with pytest.raises(SystemExit):
        cli.main(argv)
    out = capsys.readouterr().out
    assert "options" in out
    assert "`" not in out and ":func:" not in out and ":class:" not in out


def test_an_option_whose_default_is_none_takes_none_as_its_help_says(capsys):
    # the help says "(default: None)" and "None for none"; --window-max-nonzero None failed
    # with "invalid int value: 'None'"
    from impl.methods import method_class

    parser = cli._train_parser(method_class("campfire").Config)
    for given in ("None", "none"):
        args = parser.parse_args(["--window-max-nonzero", given, "--start-epoch", "3"])
        assert args.method__window_max_nonzero is None and args.method__start_epoch == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--window-max-nonzero", "many"])
    assert "invalid int value: 'many'" in capsys.readouterr().err


def test_none_for_threads_and_steps_per_epoch_as_their_help_says(capsys):
    """--threads and --max-steps-per-epoch say "(None: ...)" but refused "none"; and at the
    smoke scale (3 steps an epoch) "none" is how to ask for every batch."""
    from impl.config import resolve

    parser = cli._train_parser(None)

    def cfg(*argv):
        return cli._resolve_from_args(parser.parse_args(["--scale", "smoke", *argv]), {})

    assert cfg().max_steps_per_epoch == 3  # the scale's
    assert cfg("--max-steps-per-epoch", "5").max_steps_per_epoch == 5
    assert cfg("--max-steps-per-epoch", "None").max_steps_per_epoch is None  # every batch
    assert cfg("--threads", "none").threads is None and cfg("--threads", "1").threads == 1
    assert cfg("--threads", " None ").threads is None  # as a boolean takes " True "
    for flag in ("--threads", "--max-steps-per-epoch"):
        with pytest.raises(SystemExit):
            parser.parse_args([flag, "many"])
        assert "invalid int value: 'many'" in capsys.readouterr().err
    # with --resume, "none" repeats a run saved with every batch, and changes one saved with 3
    every = resolve("cpu", max_steps_per_epoch=None)
    assert cli._is_saved_value("max_steps_per_epoch", cli.EVERY_BATCH, every, "r")
    assert not cli._is_saved_value("max_steps_per_epoch", cli.EVERY_BATCH, resolve("smoke"), "r")


@pytest.mark.parametrize("method", ["clicktrain", "prunetrain", "sdgp", "campfire"], ids=str)
def test_every_method_option_is_documented_and_its_flag_says_so(method, capsys):
    from impl.methods import method_class

    config = method_class(method).Config
    helps = cli.field_help(config)
    assert set(helps) == {f.name for f in dataclasses.fields(config)}
    assert all(helps.values())
    with pytest.raises(SystemExit):
        cli.main(["train", "--method", method, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    first = dataclasses.fields(config)[0].name
    assert " ".join(helps[first].replace("``", "").split()[:4]) in out


# ----------------------------------------------------------------------------- bad runs


SMOKE = ["train", "--scale", "smoke", "--epochs", "1", "--max-steps-per-epoch", "1",
         "--threads", "1", "--no-progress"]  # fmt: skip


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--data", "cifar10", "--data-dir", "{tmp}/nowhere"], "cifar10"),
        (["--image-size", "2"], "image_size must be in [8, 64]"),
        (
            ["--device", "cuda:0"]
            if not __import__("torch").cuda.is_available()
            else ["--device", "cuda:999"],
            "--device 'cuda",
        ),  # fmt: skip
        (["--device", "gpu"], "is not a device"),
        (["--threads", "0"], "error: --threads must be >= 1"),
        (["--batch-size", "0"], "error: --batch-size must be >= 1"),
        (["--method", "sdgp", "--prune-method", "foo"], "unknown N:M pruning function 'foo'"),
        (["--method", "campfire", "--final-sparsity", "2"], "error: --final-sparsity must be"),
        (
            ["--method", "prunetrain", "--dynamic-batch", "true", "--max-batch", "0"],
            "error: --max-batch must be >= 1, got 0",
        ),
        (
            ["--method", "clicktrain", "--pool-epochs", "0"],
            "error: --pool-epochs must be >= 1 in ClickTrain's schedule, got 0",
        ),
        (["--data-dir", "{tmp}/nowhere"], "digits is not read from a directory"),
        (["--data-dir", "cifar10={tmp}/c10"], "digits is not read from a directory"),
    ],
    ids=[
        "missing-data",
        "image-size",
        "absent-cuda",
        "device-name",
        "threads",
        "batch-size",
        "sdgp-option",
        "method-option-named-as-its-flag",
        "second-of-two-options-named-as-its-flag",
        "schedule-option-named-as-its-flag",
        "data-dir-of-embedded-data",
        "named-data-dir-of-embedded-data",
    ],  # fmt: skip
)
def test_a_bad_setting_is_one_line_and_leaves_no_run_directory(tmp_path, capsys, flags, needle):
    out = tmp_path / "run"
    flags = [f.format(tmp=tmp_path) for f in flags]
    assert cli.main([*SMOKE, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()  # so the corrected command is not refused as "already a run"
    assert cli.main([*SMOKE, "--out", str(out)]) == 0


@pytest.mark.parametrize("nested", [False, True], ids=["at-file", "under-file"])
def test_an_out_path_through_a_file_is_one_line(tmp_path, capsys, nested):
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = afile / "run" if nested else afile
    assert cli.main([*SMOKE, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{afile} is a file, not a directory" in err and len(err.splitlines()) == 1


def test_an_out_folder_holding_other_runs_is_refused(tmp_path, capsys):
    # `--out runs` would write this run's files among the runs it holds, and the folder
    # would read as one run holding the others
    runs = tmp_path / "runs"
    (runs / "dense-a").mkdir(parents=True)
    (runs / "dense-a" / "config.json").write_text("{}")
    assert cli.main([*SMOKE, "--out", str(runs)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--out {runs} holds other runs (dense-a, ...)" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in runs.iterdir()) == ["dense-a"]  # nothing written
    assert cli.main([*SMOKE, "--out", str(runs / "new")]) == 0  # a folder of its own: fine


def test_another_programs_config_json_is_no_run_to_continue(tmp_path, capsys):
    """--out said "already holds a run; continue it with --resume", and --resume then said
    "unknown config keys ['my']", naming no file."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"my": 1, "setting": 2}')
    said = f"{other / 'config.json'} is not the config.json of a pdtbench run (unknown config "
    assert cli.main([*SMOKE, "--out", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{said}keys: my, setting); choose another --out" in err and "--resume" not in err
    assert cli.main(["train", "--resume", str(other)]) == 2
    assert f"{said}keys: my, setting)" in capsys.readouterr().err
    assert sorted(p.name for p in other.iterdir()) == ["config.json"]  # nothing written


def test_resume_refuses_flags_that_would_change_the_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main([*SMOKE, "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--epochs", "4", "--lr", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--epochs, --lr cannot change it" in err
    # refused before torchrun would start workers that each refuse it
    assert cli.main(["train", "--resume", str(out), "--epochs", "4", "--nproc", "2"]) == 2
    assert "--epochs cannot change it" in capsys.readouterr().err
    # how to run is not what to train: these are accepted, and a complete run is reported
    assert cli.main(["train", "--resume", str(out), "--no-progress", "--nproc", "1"]) == 0
    # a flag that repeats the saved value changes nothing: accepted; another method is not
    same = ["--out", str(out), "--epochs", "1", "--device", "cpu", "--method", "dense"]
    assert cli.main(["train", "--resume", str(out), "--no-progress", *same]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--method", "sdgp"]) == 2
    assert "--method cannot change it" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(out), "--out", str(tmp_path / "other")]) == 2
    assert "--out cannot change it" in capsys.readouterr().err


def test_resume_refuses_a_changing_flag_written_with_an_equals_sign(tmp_path, capsys):
    from impl import rundir
    from impl.config import resolve

    run = tmp_path / "run"
    run.mkdir()
    saved = resolve("smoke", out=str(run))
    assert saved.epochs != 9 and saved.lr != 0.5
    rundir.write_json(run / rundir.CONFIG_FILE, saved.to_dict())
    assert cli.main(["train", "--resume", str(run), "--epochs=9", "--lr=0.5"]) == 2
    assert "--epochs, --lr cannot change it" in capsys.readouterr().err


def test_resume_reads_a_resumed_runs_method_options_as_its_flags(tmp_path, capsys):
    out = tmp_path / "sdgp"
    assert cli.main([*SMOKE, "--method", "sdgp", "--m", "8", "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--no-progress", "--m", "8"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--m", "4"]) == 2
    assert "--m cannot change it" in capsys.readouterr().err
    # an option at its default is not saved (the run keeps none at their defaults): --n 2
    # repeats it, --n 1 changes it
    assert "n" not in json.loads((out / "config.json").read_text())["method_options"]
    assert cli.main(["train", "--resume", str(out), "--no-progress", "--n", "2"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--n", "1"]) == 2
    assert "--n cannot change it" in capsys.readouterr().err


def test_ctrl_c_names_the_resume_command_and_exits_130(tmp_path, capsys, monkeypatch):
    import impl.train
    from impl import rundir

    out = tmp_path / "run"

    def interrupted_after_one_epoch(cfg, progress=True):
        out.mkdir(exist_ok=True)
        rundir.write_json(out / rundir.CONFIG_FILE, cfg.to_dict())
        rundir.append_metrics(out, {"epoch": 0, "train_loss": 1.0})
        rundir.save_checkpoint(out, {"epoch": 1}, cfg.digest())
        rundir.append_metrics(out, {"epoch": 1, "train_loss": 0.9})  # its checkpoint: not yet
        raise KeyboardInterrupt

    monkeypatch.setattr(impl.train, "train", interrupted_after_one_epoch)
    assert cli.main([*SMOKE, "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip()
    # what resume keeps: the checkpoint's epochs, not the metrics lines (an epoch's line is
    # written before its checkpoint)
    assert err == (
        f"pdtbench train: interrupted; 1 finished epoch(s) are saved: continue with "
        f"`pdtbench train --resume {out}`"
    )

    def interrupted_while_loading(cfg, progress=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(impl.train, "train", interrupted_while_loading)
    assert cli.main([*SMOKE, "--out", str(tmp_path / "other")]) == 130
    assert "before the run began; nothing was written" in capsys.readouterr().err


def test_sigterm_during_training_names_the_resume_command_and_exits_143(
    tmp_path, capsys, monkeypatch
):
    import impl.train
    from impl import rundir

    out = tmp_path / "run"

    def terminated_after_one_epoch(cfg, progress=True):
        out.mkdir(exist_ok=True)
        rundir.write_json(out / rundir.CONFIG_FILE, cfg.to_dict())
        rundir.save_checkpoint(out, {"epoch": 1}, cfg.digest())
        raise cli.Terminated

    monkeypatch.setattr(impl.train, "train", terminated_after_one_epoch)
    assert cli.main([*SMOKE, "--out", str(out)]) == cli.EXIT_TERMINATED == 143
    assert capsys.readouterr().err.strip() == (
        f"pdtbench train: interrupted; 1 finished epoch(s) are saved: continue with "
        f"`pdtbench train --resume {out}`"
    )


def test_ctrl_c_while_the_first_imports_load_exits_130_without_a_traceback(monkeypatch, capsys):
    """Ctrl-C in a command's first second and a half (torch importing, before the command's
    own handling) printed a Python traceback; it stops as quietly as later. The command's
    first import is where it lands: `pdtbench env` imports impl.env, and torch with it."""
    import sys
    import types

    class Importing(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):  # what repr and import machinery look up
                raise AttributeError(name)
            raise KeyboardInterrupt  # as Ctrl-C lands in the middle of an import

    monkeypatch.setitem(sys.modules, "impl.env", Importing("impl.env"))
    try:
        code = cli.main(["env"])
    except KeyboardInterrupt:  # what the interpreter prints with its traceback
        pytest.fail("KeyboardInterrupt escaped pdtbench's main")
    assert code == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "pdtbench env: interrupted\n"


def test_the_errors_caught_are_those_of_modules_loaded_whole(monkeypatch):
    """`_main` catches the training modules' errors without importing them: a module not
    loaded, or stopped halfway through its import (the class not made yet), adds none."""
    import sys
    import types

    from impl.train import RunExistsError

    assert cli._raised_by_loaded(("impl.train", "RunExistsError")) == (RunExistsError,)
    monkeypatch.delitem(sys.modules, "impl.train")
    assert cli._raised_by_loaded(("impl.train", "RunExistsError")) == ()
    monkeypatch.setitem(sys.modules, "impl.train", types.ModuleType("impl.train"))
    assert cli._raised_by_loaded(("impl.train", "RunExistsError")) == ()


@pytest.mark.parametrize(
    ("command", "said"),
    [("train", "interrupted before the run began; nothing was written"),
     ("reproduce", "interrupted; what finished is kept (runs, results): the same command "
                   "continues from there"),
     ("demo", "interrupted; what finished is kept (runs, results): the same command "
              "continues from there"),
     ("report", "interrupted")],
    ids=str,
)  # fmt: skip
def test_ctrl_c_in_any_command_is_one_line_saying_what_that_command_keeps(
    monkeypatch, capsys, command, said
):
    # a train stopped while it started up said reproduce's "what finished is kept (runs,
    # results)": a single run keeps no results, and had written nothing
    def stopped(argv):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, command, stopped)
    assert cli.main([command]) == cli.EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == f"pdtbench {command}: {said}\n"


def test_ctrl_c_under_nproc_names_the_resume_with_its_processes(tmp_path, monkeypatch, capsys):
    """The launcher of `--nproc 2` said "the same command continues from there", which the
    run directory then refuses; it names the resume, with the processes."""
    from impl import distributed, rundir

    out = tmp_path / "run"

    def job_stopped_after_two_epochs(argv, nproc, **kw):
        out.mkdir()
        rundir.write_json(out / rundir.CONFIG_FILE, {"method": "dense"})
        rundir.save_checkpoint(out, {"epoch": 2}, "digest")
        raise KeyboardInterrupt

    monkeypatch.setattr(distributed, "launch", job_stopped_after_two_epochs)
    assert cli.main([*SMOKE, "--nproc", "2", "--out", str(out)]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == (
        f"pdtbench train: interrupted; 2 finished epoch(s) are saved: continue with "
        f"`pdtbench train --resume {out} --nproc 2`"
    )
    # a timeout it was given is in the command that continues it
    out = tmp_path / "run2"
    argv = [*SMOKE, "--nproc", "2", "--dist-timeout", "90", "--out", str(out)]
    assert cli.main(argv) == cli.EXIT_INTERRUPTED
    hint = f"`pdtbench train --resume {out} --nproc 2 --dist-timeout 90`"
    assert capsys.readouterr().err.strip().endswith(hint)


@pytest.mark.parametrize(
    "summary, needle",
    [
        ({"data_synthetic": True, "top1": 11.7}, "synthetic data"),
        (
            {"data_spec": {"num_classes": 10}, "top1": 17.0, "epochs": 2, "scale": "cpu"},
            "within twice chance (10.0% for 10 classes): 2 epoch(s) were too few steps to learn; "
            "--scale cpu trains 15 epochs",
        ),  # fmt: skip
        (
            {"data_spec": {"num_classes": 100}, "top1": 1.5, "epochs": 30, "scale": "cpu"},
            "within twice chance (1.0% for 100 classes)",
        ),  # fmt: skip
        ({"data_spec": {"num_classes": 10}, "top1": 20.0, "epochs": 2, "scale": "cpu"}, None),
        (
            {"data_spec": {"num_classes": 10}, "top1": 10.0, "epochs": 1, "scale": "smoke"},
            "1 epoch(s) were too few steps to learn; --scale smoke checks that the pipeline "
            "runs (a few steps an epoch) and is not meant to learn: --scale cpu trains to",
        ),  # fmt: skip
        (
            {
                "data_spec": {"num_classes": 10, "train_size": 1437, "name": "digits"},
                "batch_size": 5000,
                "top1": 9.7,
                "epochs": 1,
            },
            "--batch-size 5000 is larger than the 1437 training samples of digits: each "
            "epoch was one step of 1437",
        ),  # fmt: skip
        (
            {
                "data_spec": {"num_classes": 10, "train_size": 1437},
                "batch_size": 1437,
                "top1": 90.0,
            },
            None,
        ),  # fmt: skip
    ],
    ids=[
        "synthetic",
        "short-run",
        "many-classes",
        "learned",
        "smoke",
        "batch-over-data",
        "full-batch",
    ],  # fmt: skip
)
def test_result_note_flags_what_a_top1_does_not_mean(summary, needle):
    note = cli._result_note(summary)
    if needle is None:
        assert note is None
    else:
        assert needle in note
    if summary.get("epochs") == 30:
        assert "trains 15 epochs" not in note  # more epochs than the preset: no advice
    if summary.get("scale") == "smoke":
        assert "trains 2 epochs" not in note  # more epochs of a few steps would not learn


@pytest.mark.parametrize("value", ["0", "-2", "two"], ids=["zero", "negative", "word"])
def test_jobs_must_be_a_whole_number_of_at_least_one(value, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["reproduce", "sdgp.table1", "--jobs", value])
    assert stop.value.code == 2
    assert f"argument --jobs: needs a whole number >= 1, got '{value}'" in capsys.readouterr().err


def test_a_field_with_a_default_factory_shows_that_default_in_help():
    @dataclasses.dataclass
    class Listy(MethodConfig):
        """Args:
        layers: which layers.
        """

        layers: list[str] = dataclasses.field(default_factory=lambda: ["a", "b"])

    parser = argparse.ArgumentParser()
    cli.add_method_arguments(parser, Listy)
    text = parser.format_help()
    assert "which layers. (default: ['a', 'b'])" in " ".join(text.split())


def test_a_run_directory_in_use_is_refused_in_one_line(tmp_path, capsys):
    import os

    from impl import rundir

    out = tmp_path / "run"
    assert cli.main([*SMOKE, "--out", str(out)]) == 0
    (out / "summary.json").unlink()  # as if killed before the end: --resume would train
    capsys.readouterr()
    with rundir.locked(out):  # another process training into it (flock: per open file)
        assert (out / rundir.LOCK_FILE).read_text().strip() == str(os.getpid())
        assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert f"being trained by another process (pid {os.getpid()})" in err
        assert len(err.splitlines()) == 1
        # a new run into it is told the same, not to resume a run that is being trained
        assert cli.main([*SMOKE, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"being trained by another process (pid {os.getpid()})" in err, err
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        with rundir.locked(fresh):
            assert cli.main([*SMOKE, "--out", str(fresh)]) == 2
            assert "being trained by another process" in capsys.readouterr().err
            assert not (fresh / "config.json").exists()
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0  # released


def test_every_train_flag_says_what_it_sets_and_its_default_at_each_scale():
    from impl.config import SCALE_PRESETS

    parser = cli._train_parser(None)
    silent = [a.option_strings for a in parser._actions if not a.help and a.option_strings]
    assert silent == []
    text = " ".join(parser.format_help().split())
    presets = ", ".join(f"{s} {SCALE_PRESETS[s]['epochs']}" for s in SCALE_PRESETS)
    assert f"number of training epochs (default by --scale: {presets})" in text
    assert "SGD momentum (default: 0.9)" in text  # no preset sets it
    assert "(default by --scale: smoke none, cpu none, gpu none, paper 90 135)" in text
    # smoke stops each epoch after 3 steps; the other scales train on every batch
    assert "(default by --scale: smoke 3, cpu none, gpu none, paper none)" in text
    # a switch says what it turns on or off, with no "(default: False)" after it
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["no_augment"].endswith(", on by default")
    assert "(default" not in helps["eval_flip"] and "(default" not in helps["bf16"]


@pytest.mark.parametrize("argv", [["reproduce", "--list"], ["env"], ["--help"], ["--version"]])
def test_output_piped_into_a_reader_that_leaves_stops_quietly_with_141(argv):
    # `pdtbench reproduce --list | head -1`: once the reader has closed the pipe, the next
    # write fails; that is the user's doing, not an error to print (nor a traceback).
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.Popen(
        [sys.executable, "-m", "impl.cli", *argv],
        cwd=Path(cli.__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before the interpreter has started: its first write meets no reader
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == cli.EXIT_BROKEN_PIPE
    assert err == ""


def test_a_broken_pipe_other_than_stdout_is_an_error(capsys, monkeypatch):
    def worker_gone(argv):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli.COMMANDS, "reproduce", worker_gone)
    assert cli.main(["reproduce", "all"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err == "pdtbench reproduce: error: [Errno 32] Broken pipe\n"


def test_a_value_error_from_outside_the_project_says_where_it_was_raised(capsys, monkeypatch):
    """A ValueError the project raises is its message for the user, one line; one raised inside
    torch (a failure of the work, not of the input) says where, and PDTBENCH_TRACEBACK=1 adds
    the traceback."""

    def ours(argv):
        from impl import models

        models.create("nope")

    def torch_refuses(argv):
        torch.nn.functional.batch_norm(torch.ones(1, 3, 1, 1), None, None, training=True)

    monkeypatch.delenv(cli.TRACEBACK_VARIABLE, raising=False)
    monkeypatch.setitem(cli.COMMANDS, "train", ours)
    assert cli.main(["train"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("pdtbench train: error: unknown model 'nope'; valid models: resnet20")
    assert len(err.splitlines()) == 1 and "raised in" not in err
    monkeypatch.setitem(cli.COMMANDS, "train", torch_refuses)
    assert cli.main(["train"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("pdtbench train: error: Expected more than 1 value per channel")
    assert re.search(r"\(raised in functional\.py:\d+ _verify_batch_size, outside pdtbench;", err)
    assert "Traceback" not in err and len(err.splitlines()) == 1
    monkeypatch.setenv(cli.TRACEBACK_VARIABLE, "1")
    assert cli.main(["train"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "torch_refuses" in err
    assert err.splitlines()[-1].startswith("pdtbench train: error: Expected more than 1 value")


def test_stdout_reader_gone_sees_a_pipe_whose_reader_closed(monkeypatch):
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "w") as writer:
        monkeypatch.setattr("sys.stdout", writer)
        assert not cli.stdout_reader_gone()
        os.close(read_fd)
        assert cli.stdout_reader_gone()


def test_resume_takes_a_new_data_dir_for_data_that_moved(tmp_path, monkeypatch, capsys):
    # Where the dataset is read from is not part of the run: a run whose data moved can be
    # resumed with --data-dir (it was refused as a change to the run), and the new place is
    # saved for the next resume.
    import impl.train
    from impl import rundir

    out = tmp_path / "run"
    from impl.config import resolve

    cfg = resolve("smoke", method="dense", data="cifar10", out=str(out),
                  data_dir=str(tmp_path / "old"))  # fmt: skip
    monkeypatch.setattr(impl.train, "check_dataset", lambda *a, **k: None)  # no CIFAR files
    out.mkdir()
    rundir.write_json(out / rundir.CONFIG_FILE, cfg.to_dict())  # a run stopped before its end
    seen = {}

    def fake_run(self, resume=False):
        seen.update(data_dir=self.cfg.data_dir, resume=resume, digest=self.cfg.digest())
        return {"status": "complete", "top1": 1.0}

    monkeypatch.setattr(impl.train.Trainer, "run", fake_run)
    monkeypatch.setattr(cli, "_print_result", lambda *a: None)
    new = str(tmp_path / "new")
    assert cli.main(["train", "--resume", str(out), "--data-dir", new]) == 0
    assert seen == {"data_dir": new, "resume": True, "digest": cfg.digest()}
    assert rundir.read_json(out / rundir.CONFIG_FILE)["data_dir"] == new
    # a worker of a job other than rank 0 reads the new place and writes nothing
    from impl import distributed

    monkeypatch.setattr(distributed, "current", lambda: distributed.DistInfo(1, 2))
    newer = str(tmp_path / "newer")
    impl.train.resume(out, data_dir=newer)
    assert seen["data_dir"] == newer
    assert rundir.read_json(out / rundir.CONFIG_FILE)["data_dir"] == new


@pytest.mark.parametrize(
    "flags, both",
    [
        (["--no-augment", "--augment-recipe", "ffcv"], ("--augment-recipe", "--no-augment")),
        (["--dist-timeout", "5"], ("--dist-timeout", "--nproc")),
        (["--method", "sdgp", "--prune-method", "random", "--rescale", "channel"],
         ("--rescale is a setting of --prune-method rescaled", "--prune-method is random")),
        (["--method", "sdgp", "--prune-method", "magnitude", "--rescale-eps", "0.001"],
         ("--rescale-eps is a setting", "--prune-method is magnitude")),
        (["--method", "campfire", "--mask", "window", "--window-fraction", "0.3"],
         ("--window-fraction is a setting of --mask combined", "--mask is window")),
        (["--method", "campfire", "--mask", "ck", "--window-max-nonzero", "4"],
         ("--window-max-nonzero is a setting of --mask window or --mask combined",
          "--mask is ck")),
        (["--method", "campfire", "--prune-fc", "false", "--fc-block", "3"],
         ("--fc-block is a setting of --prune-fc true", "--prune-fc is false")),
        (["--method", "prunetrain", "--batch-step", "64", "--max-batch", "128"],
         ("--batch-step is a setting of --dynamic-batch true", "--dynamic-batch is false")),
    ],
    ids=["no-augment-recipe", "dist-timeout-one-process", "rescale-random",
         "rescale-eps-magnitude", "window-fraction-window", "window-cap-ck",
         "fc-block-no-fc", "batch-step-fixed-batch"],
)  # fmt: skip
def test_flags_one_of_which_would_be_ignored_are_refused_naming_both(
    flags, both, capsys, tmp_path, monkeypatch
):
    """Each pair was accepted and trained, one flag of it silently doing nothing."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:  # argparse's usage error
        cli.main(["train", "--scale", "smoke", "--no-progress", "--out", str(tmp_path / "r"),
                  *flags])  # fmt: skip
    assert stop.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert all(flag in err.splitlines()[-1] for flag in both)
    assert not list(tmp_path.iterdir())  # nothing trained


def test_resume_repeating_a_dependent_option_as_saved_is_accepted(tmp_path, capsys):
    """--resume with --max-batch as the run saved it was refused as if --dynamic-batch were
    at its default (false): a resumed run's options are its own."""
    out = tmp_path / "pt"
    argv = [*SMOKE, "--method", "prunetrain", "--dynamic-batch", "true", "--max-batch", "128"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--max-batch", "128", "--no-progress"]) == 0
    assert "holds a finished run" in capsys.readouterr().out
    assert cli.main(["train", "--resume", str(out), "--max-batch", "256"]) == 2
    assert "--max-batch cannot change it" in capsys.readouterr().err


@pytest.mark.parametrize(
    "method, option, owner, refused",
    [
        # campfire.py: window pruning (--mask window) and the combined mask both round and
        # cap each kernel's nonzeros; the CK mask does neither
        ("campfire", "window_rounding", {"mask": "window"}, False),
        ("campfire", "window_rounding", {"mask": "combined"}, False),
        ("campfire", "window_rounding", {"mask": "ck"}, True),
        ("campfire", "window_max_nonzero", {"mask": "window"}, False),
        # PruneTrain's mini-batch grows to --max-batch only with --dynamic-batch true
        ("prunetrain", "max_batch", {"dynamic_batch": True}, False),
        ("prunetrain", "max_batch", {"dynamic_batch": False}, True),
        ("prunetrain", "max_batch", {}, True),  # --dynamic-batch's default is false
        ("campfire", "fc_block_fraction", {"prune_fc": False}, True),
    ],
)  # fmt: skip
def test_a_dependent_option_is_refused_only_where_its_owner_turns_it_off(
    method, option, owner, refused
):
    options = {f"method__{option}": 4, **{f"method__{k}": v for k, v in owner.items()}}
    args = argparse.Namespace(
        no_augment=False, augment_recipe=None, dist_timeout=None, nproc=1, resume=None,
        nesterov=None, momentum=None, **options
    )  # fmt: skip
    why = cli._conflicting_flags(args, method, under_torchrun=False)
    flag = "--" + option.replace("_", "-")
    if refused:
        assert why.startswith(f"{flag} is a setting of ") and why.endswith(f"or leave {flag} out")
    else:
        assert why == ""


def test_every_flag_typed_with_the_resume_of_no_saved_run_is_a_change():
    """Without a saved config to compare with, each typed flag but how to run is a change."""
    from impl.methods import method_class

    parser = cli._train_parser(method_class("dense").Config)
    argv = ["--resume", "r", "--epochs=3", "--lr", "0.1", "--no-progress"]
    args, _ = parser.parse_known_args(argv)
    assert sorted(cli._resume_changes(parser, args, argv, None)) == ["--epochs", "--lr"]


def test_every_option_owner_names_real_options_and_values():
    """OPTION_OWNERS names each option, the option it depends on, and values that option
    takes, of the method's own config (a renamed field would turn a check off silently)."""
    import dataclasses

    from impl.methods import method_class

    for (method, name), (owner, acting) in cli.OPTION_OWNERS.items():
        fields = {f.name: f for f in dataclasses.fields(method_class(method).Config)}
        assert name in fields and owner in fields, (method, name, owner)
        default = fields[owner].default
        assert all(type(v) is type(default) for v in acting), (method, owner, acting)


def test_dist_timeout_with_several_processes_is_accepted(tmp_path, monkeypatch):
    from impl import distributed

    monkeypatch.setattr(distributed, "launch", lambda argv, nproc: 0)
    argv = ["train", "--scale", "smoke", "--nproc", "2", "--dist-timeout", "5", "--out",
            str(tmp_path / "r")]  # fmt: skip
    assert cli.main(argv) == 0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "--resume", ""], "--resume needs a run directory"),
        (["train", "--resume", "  "], "--resume needs a run directory"),
        (["train", "--scale", "smoke", "--nproc", "0"], "--nproc must be >= 1, got 0"),
        (["train", "--scale", "smoke", "--dist-timeout", "-5"], "--dist-timeout must be > 0"),
        (["train", "--scale", "smoke", "--nproc", "2", "--dist-timeout", "0"],
         "--dist-timeout must be > 0"),
        (["train", "--scale", "smoke", "--nproc", "2", "--model", "nosuch"], "valid models"),
        (["train", "--scale", "smoke", "--nproc", "2", "--epochs", "0"], "--epochs must be"),
        (["train", "--scale", "smoke", "--nproc", "2", "--method", "sdgp", "--n", "9"], "n <= m"),
    ],
    ids=["resume-empty", "resume-blank", "nproc-zero", "dist-timeout", "dist-timeout-zero",
         "nproc-model", "nproc-epochs", "nproc-sdgp"],
)  # fmt: skip
def test_bad_train_flags_are_refused_once_before_any_worker_starts(
    argv, needle, capsys, monkeypatch, tmp_path
):
    # An unset "$RUN" in --resume "$RUN" started a fresh default run; under --nproc 2 each
    # torchrun worker printed the error, then torchrun its traceback (exit 1).
    from impl import distributed

    def launch(*args, **kwargs):
        raise AssertionError("torchrun was started for a run that cannot start")

    monkeypatch.setattr(distributed, "launch", launch)
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not list(tmp_path.iterdir())  # no run directory made


def test_resume_under_nproc_refuses_the_one_gpu_its_run_was_saved_with(
    tmp_path, capsys, monkeypatch
):
    from impl import distributed, rundir
    from impl.config import resolve

    def launch(*args, **kwargs):
        raise AssertionError("torchrun was started for a run that cannot start")

    monkeypatch.setattr(distributed, "launch", launch)
    run = tmp_path / "run"
    run.mkdir()
    rundir.write_json(
        run / rundir.CONFIG_FILE, resolve("smoke", out=str(run), device="cuda:1").to_dict()
    )
    assert cli.main(["train", "--resume", str(run), "--nproc", "2"]) == 2
    assert "--device cuda:1 with --nproc 2 would put every process on that one GPU" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "case", ["resume-not-a-run", "resume-busy", "resume-diverged", "missing-data", "out-finished"]
)
def test_what_every_worker_would_refuse_is_refused_once_before_torchrun(
    case, capsys, monkeypatch, tmp_path
):
    """Under --nproc 2 these were refused by each worker inside torchrun: 60-130 lines of
    tracebacks and exit 1. The launching process refuses them in one line, as one process
    does, and starts no worker."""
    from impl import distributed, rundir

    def launch(*args, **kwargs):
        raise AssertionError("torchrun was started for a run that cannot start")

    monkeypatch.setattr(distributed, "launch", launch)
    monkeypatch.delenv("PDTBENCH_DATA_DIR", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    base = ["train", "--nproc", "2", "--scale", "smoke"]
    code, needle = 2, None
    with contextlib.ExitStack() as stack:
        if case == "missing-data":
            argv = [*base, "--data", "cifar10", "--out", str(tmp_path / "new")]
            needle = "cifar10: no data directory"
        elif case == "out-finished":
            rundir.write_json(run / rundir.CONFIG_FILE, {"method": "dense"})
            rundir.write_json(run / rundir.SUMMARY_FILE, {"status": "complete"})
            argv, needle = [*base, "--out", str(run)], "already holds a finished run"
        elif case == "resume-not-a-run":
            argv, needle = ["train", "--nproc", "2", "--resume", str(run)], "is not a run directory"
        else:
            assert cli.main(["train", "--scale", "smoke", "--epochs", "1", "--out", str(run),
                             "--max-steps-per-epoch", "1", "--no-progress"]) == 0  # fmt: skip
            (run / rundir.SUMMARY_FILE).unlink()  # killed before its end
            if case == "resume-busy":
                stack.enter_context(rundir.locked(run))  # another process trains it
                needle = "is being trained by another process"
            else:
                rundir.write_json(
                    run / rundir.SUMMARY_FILE, {"status": "diverged", "diverged_epoch": 0}
                )
                code, needle = cli.EXIT_FAILED, "diverged"
            capsys.readouterr()
            argv = ["train", "--nproc", "2", "--resume", str(run)]
        assert cli.main(argv) == code
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_an_unreadable_cifar_batch_is_one_line_naming_the_file(tmp_path, capsys):
    from impl.data import _CIFAR

    folder = tmp_path / _CIFAR["cifar10"][0]
    folder.mkdir()
    for name in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                 "data_batch_5", "test_batch", "batches.meta"]:  # fmt: skip
        (folder / name).write_bytes(b"not a pickle at all")
    argv = ["train", "--scale", "smoke", "--data", "cifar10", "--data-dir", str(tmp_path),
            "--out", str(tmp_path / "run"), "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a batch file of the CIFAR python tarball" in err and str(folder) in err
    assert len(err.splitlines()) == 1


def test_demo_and_reproduce_progress_bars_stay_off_a_log(monkeypatch):
    # --no-progress reaches the demo; without a terminal the runs' bar draws nothing
    import reproductions
    from reproductions.parallel import _bar

    seen = {}
    monkeypatch.setattr(reproductions, "demo", lambda **kw: seen.update(kw))
    assert cli.main(["demo", "--scale", "smoke", "--no-progress"]) == 0
    assert seen["progress"] is False
    # the runs folder is named as reproduce names it, or as it was
    for flag in ("--runs-root", "--runs"):
        assert cli.main(["demo", "--scale", "smoke", "--no-progress", flag, "r/x"]) == 0
        assert str(seen["runs_root"]) == "r/x"
    bar = _bar(3, True)  # pytest's stderr is not a terminal
    assert bar.disable
    bar.close()


def test_the_same_train_command_again_prints_its_finished_run_instead_of_refusing_it(
    capsys, monkeypatch, tmp_path
):
    # the default --out is named by the config's digest: a second `pdtbench train ...` found
    # its own finished run there and failed with "choose another --out"
    import impl.env

    monkeypatch.chdir(tmp_path)
    here = {"commit": "a" * 40, "dirty": False}
    real = impl.env.collect
    monkeypatch.setattr(impl.env, "collect", lambda gpu=None: {**real(gpu), **here})
    argv = ["train", "--scale", "smoke", "--epochs", "1", "--max-steps-per-epoch", "1",
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    first = capsys.readouterr().out
    assert cli.main(argv) == 0
    again = capsys.readouterr().out
    assert "already holds this config's finished run, trained by this commit" in again
    assert first.splitlines()[0] == again.splitlines()[1]  # the same result line
    # --resume of the finished run says so too, rather than print the result as if trained
    (run,) = [p.parent for p in (tmp_path / "runs").rglob("summary.json")]
    assert cli.main(["train", "--resume", str(run), "--no-progress"]) == 0
    resumed = capsys.readouterr().out
    assert resumed.splitlines()[0] == f"{run} holds a finished run: its result (nothing trained)"
    assert resumed.splitlines()[1] == first.splitlines()[0]
    from impl import distributed

    def launch(*args, **kwargs):
        raise AssertionError("torchrun was started")

    monkeypatch.setattr(distributed, "launch", launch)
    # a finished run resumed under --nproc: its result, with no torchrun started for it
    assert cli.main(["train", "--resume", str(run), "--nproc", "2", "--no-progress"]) == 0
    assert capsys.readouterr().out.splitlines() == resumed.splitlines()
    assert cli.main([*argv, "--nproc", "2"]) == 2  # another way of training: refused
    assert "already holds a finished run" in capsys.readouterr().err
    here["dirty"] = True  # the same commit with changes in the tree: not this code's run
    assert cli.main(argv) == 2
    assert "already holds a finished run" in capsys.readouterr().err
    here["dirty"] = False
    here["commit"] = "b" * 40  # other code since: refused as before, never trained over
    assert cli.main(argv) == 2
    assert "already holds a finished run" in capsys.readouterr().err


def test_a_finished_run_is_the_same_only_from_this_clean_commit_its_processes_and_device(
    tmp_path, monkeypatch, capsys
):
    import impl.env

    here = {"commit": "c" * 40, "dirty": False}
    monkeypatch.setattr(impl.env, "collect", lambda gpu=None: dict(here))

    def saved(**fields):
        environment = {"commit": "c" * 40, "dirty": False}
        summary = {"status": "complete", "environment": environment, "world_size": 1}
        summary.update({"device": "cpu", **fields})
        (tmp_path / "summary.json").write_text(json.dumps(summary))
        return summary

    summary = saved()
    assert cli._same_finished_run(tmp_path, 1, "cpu") == summary
    assert capsys.readouterr().out == (
        f"{tmp_path} already holds this config's finished run, trained by this commit: its "
        "result (--seed or --out trains another)\n"
    )
    # trained from a tree with changes: not this commit's code, whatever the tree is now
    saved(environment={"commit": "c" * 40, "dirty": True})
    assert cli._same_finished_run(tmp_path, 1, "cpu") is None
    saved()
    here["dirty"] = True  # this tree has changes now
    assert cli._same_finished_run(tmp_path, 1, "cpu") is None
    here.update(dirty=False, commit=None)  # not a git checkout: no commit to compare
    saved(environment={"commit": None, "dirty": False})
    assert cli._same_finished_run(tmp_path, 1, "cpu") is None
    here["commit"] = "c" * 40
    # two processes trained it: the same only for --nproc 2
    summary = saved(world_size=2)
    assert cli._same_finished_run(tmp_path, 1, "cpu") is None
    assert cli._same_finished_run(tmp_path, 2, "cpu") == summary
    assert "already holds" in capsys.readouterr().out
    # trained on a GPU: not what --device cpu trains
    saved(device="cuda:0")
    assert cli._same_finished_run(tmp_path, 1, "cpu") is None
    (tmp_path / "summary.json").write_text(json.dumps({"status": "training"}))
    assert cli._same_finished_run(tmp_path, 1, "cpu") is None
    assert "already holds" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [["train", "--scale", "tiny"], ["reproduce", "sdgp.table1", "--scale", "Smoke"],
     ["report"], ["train", "--epochs", "x"]],
    ids=["choice", "reproduce-choice", "missing", "type"],
)  # fmt: skip
def test_a_usage_error_is_one_line_naming_the_help(argv, capsys):
    # argparse printed its whole usage block (20 lines for train) before the error
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    command = f"pdtbench {argv[0]}"
    assert err.count("\n") == 0 and err.startswith(f"{command}: error: ")
    assert err.endswith(f"(see {command} --help)")


# ----------------------------------------------------------------------------- small parts


def test_exit_statuses_are_the_shells_conventions():
    # scripts and schedulers read these numbers; the tests elsewhere compare to the names
    assert (cli.EXIT_FAILED, cli.EXIT_USAGE) == (1, 2)
    assert (cli.EXIT_INTERRUPTED, cli.EXIT_BROKEN_PIPE, cli.EXIT_TERMINATED) == (130, 141, 143)


def test_bare_pdtbench_prints_the_usage_and_exits_2(capsys):
    assert cli.main([]) == cli.EXIT_USAGE
    assert capsys.readouterr().out.startswith("usage: pdtbench {")
    assert cli.main(["--help"]) == 0


def test_did_you_mean_a_case_a_typo_or_a_papers_items():
    from impl.cli_parser import did_you_mean

    valid = ["sdgp.table1", "sdgp.fig8", "campfire.table1"]
    assert did_you_mean("SDGP.Table1", valid) == " (did you mean 'sdgp.table1'?)"
    assert did_you_mean("sdgp.tabel1", valid) == " (did you mean 'sdgp.table1'?)"
    assert did_you_mean("sdgp", valid) == " (its items: sdgp.table1, sdgp.fig8)"
    assert did_you_mean("SDGP", valid) == " (its items: sdgp.table1, sdgp.fig8)"
    assert did_you_mean("sdg", valid) == ""  # a prefix of a paper's name is not the paper
    # a paper's name close to one of its items by edit distance is still the paper
    valid = ["clicktrain.fig9", "clicktrain.table1"]
    assert did_you_mean("clicktrain", valid) == " (its items: clicktrain.fig9, clicktrain.table1)"
    assert did_you_mean("xyz", valid) == ""


@pytest.mark.parametrize(
    "text, value",
    [(" True ", True), ("YES", True), ("on", True), ("1", True), ("NO", False),
     ("False", False), ("off", False), ("0", False)],
)  # fmt: skip
def test_a_boolean_option_takes_the_usual_words_in_any_case(text, value):
    assert cli._str2bool(text) is value


def test_a_boolean_option_refuses_other_words():
    with pytest.raises(argparse.ArgumentTypeError, match="expected true or false, got 'maybe'"):
        cli._str2bool("maybe")


def test_sdgp_rescale_alone_is_a_setting_of_the_default_pruning_function():
    from impl.methods import method_class

    parser = cli._train_parser(method_class("sdgp").Config)
    args = parser.parse_args(["--rescale", "channel"])  # rescaled is SDGP's default
    assert cli._conflicting_flags(args, "sdgp", False) == ""
    args = parser.parse_args(["--rescale", "channel", "--prune-method", "magnitude"])
    assert "--prune-method is magnitude" in cli._conflicting_flags(args, "sdgp", False)


def test_result_note_gives_the_presets_epochs_only_when_fewer_were_trained():
    summary = {"data_spec": {"num_classes": 10}, "top1": 12.0, "scale": "cpu"}
    at_preset = cli._result_note({**summary, "epochs": 15})
    assert "within twice chance" in at_preset and "trains 15 epochs" not in at_preset
    assert "--scale cpu trains 15 epochs" in cli._result_note({**summary, "epochs": 14})


def test_no_augment_trains_without_augmentation_and_resumes_with_the_flag_repeated(
    tmp_path, capsys
):
    plain, off = tmp_path / "plain", tmp_path / "off"
    assert cli.main([*SMOKE, "--no-augment", "--out", str(off)]) == 0
    assert json.loads((off / "config.json").read_text())["augment"] is False
    assert cli.main([*SMOKE, "--out", str(plain)]) == 0
    assert json.loads((plain / "config.json").read_text())["augment"] is not False
    capsys.readouterr()
    # repeating what the run was trained with changes nothing; turning it off does
    assert cli.main(["train", "--resume", str(off), "--no-progress", "--no-augment"]) == 0
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(plain), "--no-augment"]) == 2
    assert "--no-augment cannot change it" in capsys.readouterr().err


def test_nproc_starts_torchrun_with_the_whole_train_command(tmp_path, monkeypatch):
    from impl import distributed

    seen = {}
    monkeypatch.setattr(distributed, "launch", lambda argv, nproc: seen.update(a=argv, n=nproc))
    argv = ["--scale", "smoke", "--nproc", "2", "--dist-timeout", "5", "--out", str(tmp_path)]
    cli.main(["train", *argv])
    assert seen == {"a": ["train", *argv], "n": 2}


def test_a_torchrun_worker_takes_its_dist_timeout(tmp_path, monkeypatch, capsys):
    # under torchrun the flag applies without --nproc, and reaches the worker's process group
    from impl import distributed

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    seen = {}

    def run_worker(fn, device, timeout_s=None, **kwargs):
        seen["timeout"] = timeout_s
        return {"top1": 50.0, "method": "dense"}

    monkeypatch.setattr(distributed, "run_worker", run_worker)
    argv = ["train", "--scale", "smoke", "--dist-timeout", "5", "--no-progress"]
    assert cli.main([*argv, "--out", str(tmp_path / "r")]) == 0
    assert seen == {"timeout": 5.0}


def test_eval_fgsm_attacks_at_0_005_and_01_by_default(tmp_path, monkeypatch, capsys):
    import impl.robustness

    seen = []
    summary: dict = {"status": "complete"}  # what check_attackable returns of the run
    monkeypatch.setattr(impl.robustness, "check_attackable", lambda run_dir: summary)

    def attack(run_dir, eps, device, data_dir):
        seen.append(list(eps))
        return [{"eps": e, "top1": 10.0} for e in eps]

    monkeypatch.setattr(impl.robustness, "eval_fgsm_run", attack)
    assert cli.main(["eval-fgsm", str(tmp_path), "--device", "cpu"]) == 0
    assert seen == [[0.0, 0.05, 0.1]]
    printed = capsys.readouterr()
    assert f"{tmp_path}: eps 0.05: top-1 10.00%" in printed.out
    assert "synthetic" not in printed.err
    # a run on synthetic data (random labels): its attacked top-1 is said to mean nothing
    summary["data_synthetic"] = True
    assert cli.main(["eval-fgsm", str(tmp_path), "--device", "cpu"]) == 0
    assert f"note: {tmp_path} trained on synthetic data (random labels)" in capsys.readouterr().err


def test_a_command_restores_the_callers_sigterm_handler(monkeypatch):
    import signal

    def sentinel(signum, frame):
        pass

    seen = {}

    def command(argv):
        seen["during"] = signal.getsignal(signal.SIGTERM)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "report", command)
    old = signal.signal(signal.SIGTERM, sentinel)
    try:
        assert cli.main(["report"]) == 0
        assert seen["during"] is cli._raise_terminated  # a kill stops the command cleanly
        assert signal.getsignal(signal.SIGTERM) is sentinel  # and the caller's handler is back
    finally:
        signal.signal(signal.SIGTERM, old)


def test_first_line_of_an_error_message():
    from impl.messages import first_line

    err = RuntimeError("  CUDA error: misaligned address\nCompile with TORCH_USE_CUDA_DSA ")
    assert first_line(err) == "CUDA error: misaligned address"
    assert first_line(err, 10) == "CUDA error"
    assert first_line(RuntimeError()) == "" and first_line(AssertionError(), 5) == ""
    assert first_line(RuntimeError("x" * 300)) == "x" * 300  # no limit: the whole line


def test_resume_of_a_summary_edited_bare_says_which_file_and_what_to_do(tmp_path, capsys):
    """{"status": "complete"} alone was printed through a TypeError traceback."""
    out = tmp_path / "run"
    assert cli.main([*SMOKE, "--out", str(out)]) == 0
    summary = out / "summary.json"
    summary.write_text('{"status": "complete"}')
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{summary} says the run finished, but it lacks method" in err
    summary.unlink()  # as the message says: resume writes it anew, training nothing
    assert cli.main(["train", "--resume", str(out), "--no-progress"]) == 0
    assert json.loads(summary.read_text())["status"] == "complete"


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "runs", "--out", ""],
        ["demo", "--out", " "],
        ["reproduce", "sdgp", "--out", ""],
        ["reproduce", "sdgp", "--runs-root", ""],
        ["demo", "--runs-root", ""],
        ["train", "--scale", "smoke", "--out", ""],
        ["train", "--scale", "smoke", "--nproc", "2", "--out", " "],
    ],
    ids=[
        "report",
        "demo",
        "reproduce",
        "reproduce-runs-root",
        "demo-runs-root",
        "train",
        "train-nproc",
    ],
)
def test_an_empty_out_is_refused_not_the_current_directory(argv, capsys, tmp_path, monkeypatch):
    """An empty --out (an unset "$OUT") wrote the pages into the current directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"argument {argv[-2]}" in err and ": needs a directory; got an empty one" in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], {"scale": "cpu", "epochs": 15, "batch_size": 128, "nesterov": True, "seed": 0}),
        (["--scale", "paper", "--nesterov"], {"scale": "paper", "nesterov": True}),
        (["--no-nesterov"], {"nesterov": False}),
        (["--seed", "7", "--lr", "0.05", "--epochs", "3", "--batch-size", "64"],
         {"seed": 7, "lr": 0.05, "epochs": 3, "batch_size": 64}),
        (["--momentum", "0.8", "--weight-decay", "0.001"],
         {"momentum": 0.8, "weight_decay": 0.001}),
        (["--label-smoothing", "0.1", "--eval-flip"], {"label_smoothing": 0.1, "eval_flip": True}),
        (["--no-bn-weight-decay"], {"bn_weight_decay": False}),
        (["--warmup-start", "0.01", "--warmup-fraction", "0.3"],
         {"warmup_start": 0.01, "warmup_fraction": 0.3}),
        (["--schedule", "step", "--milestones", "3", "5", "--gamma", "0.5"],
         {"schedule": "step", "milestones": [3, 5], "gamma": 0.5}),
        (["--threads", "2", "--image-size", "16"],
         {"threads": 2, "data_options": {"image_size": 16}}),
        (["--model", "resnet18", "--stem", "imagenet", "--dist-timeout", "0.5"],
         {"model": "resnet18", "stem": "imagenet"}),
        (["--no-augment"], {"augment": False}),
    ],
    ids=["defaults", "nesterov-over-preset", "no-nesterov", "seed-lr-epochs-batch",
         "momentum-decay", "smoothing-flip", "no-bn-decay", "warmup", "step", "threads-size",
         "model-stem", "no-augment"],
)  # fmt: skip
def test_each_train_flag_sets_its_field_of_the_config_and_unset_ones_keep_the_scales(
    argv, expected
):
    """Every flag reaches the config as given; an unset one leaves the scale's preset (cpu by
    default: 15 epochs, batch 128) or the config's own default (Nesterov on, seed 0)."""
    cfg = cli._resolve_from_args(cli._train_parser(None).parse_args(argv), {})
    assert {name: getattr(cfg, name) for name in expected} == expected


def test_dist_timeout_takes_seconds_with_a_fraction():
    args = cli._train_parser(None).parse_args(["--dist-timeout", "0.5"])
    assert args.dist_timeout == 0.5


@pytest.mark.parametrize(
    "value, text",
    [(True, "true"), (False, "false"), (None, "none"), (0.1, "0.1"), (1 / 3, "0.333333"),
     (2.0, "2"), (5, "5"), ("window", "window"), ([3, 0.5], "3 0.5"), ((True, None), "true none")],
)  # fmt: skip
def test_flag_text_writes_a_value_as_train_flags_take_it(value, text):
    from impl.cli_parser import flag_text

    assert flag_text(value) == text


def test_an_out_dir_is_checked_through_every_missing_level(tmp_path):
    """A file several levels above the directory is named; a directory several levels below
    the nearest existing, writable one is fine; the message names the flag given."""
    from impl.out_dir import check_out_dir

    afile = tmp_path / "afile"
    afile.write_text("x")
    deep = afile / "a" / "b" / "run"
    with pytest.raises(ValueError) as err:
        check_out_dir(deep)
    assert str(err.value) == f"--out {deep}: {afile} is a file, not a directory"
    with pytest.raises(ValueError) as err:
        check_out_dir(afile, "--runs-root")
    assert str(err.value) == f"--runs-root {afile}: {afile} is a file, not a directory"
    check_out_dir(tmp_path / "new" / "deeper" / "run")  # made later, level by level
    fifo = tmp_path / "fifo"  # neither a regular file nor a directory
    os.mkfifo(fifo)
    with pytest.raises(ValueError) as err:  # a FIFO is no file: it says what it is not
        check_out_dir(fifo / "run")
    assert str(err.value) == f"--out {fifo / 'run'}: {fifo} is not a directory"


@pytest.mark.parametrize("denied", [os.W_OK, os.X_OK], ids=["not-writable", "not-searchable"])
def test_an_out_dir_under_a_directory_without_write_or_search_permission_is_refused(
    tmp_path, monkeypatch, denied
):
    """Writing a new entry in a directory takes both its write and its search permission."""
    from pathlib import Path

    from impl.out_dir import check_out_dir

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os,
        "access",
        lambda p, mode: not (Path(p) == locked and mode & denied) and real_access(p, mode),
    )
    with pytest.raises(ValueError) as err:
        check_out_dir(locked / "run", "--runs-root")
    assert str(err.value) == f"--runs-root {locked / 'run'}: {locked} is not writable"


def test_an_out_dir_where_no_directory_can_be_made_is_refused_whatever_the_permissions_say(
    tmp_path, monkeypatch
):
    """Root passes every permission check, and /proc refuses a new directory whatever they
    say: the check makes (and removes) one, and leaves nothing behind where it can."""
    from impl.out_dir import check_out_dir

    monkeypatch.setattr(os, "access", lambda p, mode: True)  # as for root
    with pytest.raises(ValueError, match=r"^--out /proc/pdt-run: cannot write in /proc \("):
        check_out_dir("/proc/pdt-run")
    check_out_dir(tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "dest, value, saved, repeats",
    [
        ("out", "./r/../r", {}, True),
        ("out", "other", {}, False),
        ("out", "elsewhere/r", {}, False),
        ("method__max_batch", int("1000"),
         {"method": "prunetrain", "method_options": {"dynamic_batch": True, "max_batch": 1000}},
         True),
        ("method__max_batch", 999,
         {"method": "prunetrain", "method_options": {"dynamic_batch": True, "max_batch": 1000}},
         False),
        ("method__dynamic_batch", False, {"method": "prunetrain"}, True),
        ("method__dynamic_batch", True, {"method": "prunetrain"}, False),
        ("image_size", 16, {"data_options": {"image_size": 16}}, True),
        ("image_size", 16, {}, False),
        ("no_augment", True, {"augment": False}, True),
        ("no_augment", True, {}, False),
        ("no_bn_weight_decay", True, {"bn_weight_decay": False}, True),
        ("no_bn_weight_decay", True, {}, False),
        ("epochs", 2, {}, True),
        ("epochs", 3, {}, False),
    ],
    ids=["out-same-dir", "out-other", "out-same-name-elsewhere", "option-as-saved",
         "option-changed",
         "option-at-its-default", "option-off-its-default", "image-size-as-saved",
         "image-size-unsaved", "no-augment-as-saved", "no-augment-changed",
         "no-bn-decay-as-saved", "no-bn-decay-changed", "epochs-as-saved", "epochs-changed"],
)  # fmt: skip
def test_a_flag_given_with_resume_repeats_the_saved_run_only_with_its_saved_value(
    dest, value, saved, repeats, tmp_path, monkeypatch
):
    """--out the resumed directory however written, a method option as saved (or at the
    method's default, which a run does not save), the image size, --no-augment and
    --no-bn-weight-decay of a run saved without them are repeats; other values change it."""
    from impl.config import resolve

    monkeypatch.chdir(tmp_path)
    assert cli._is_saved_value(dest, value, resolve("smoke", **saved), "r") is repeats


def test_resume_with_the_device_its_auto_picked_is_a_repeat(monkeypatch):
    """A run saved with --device auto, which picked the CPU, is resumed as saved with --device
    cpu; a device it did not pick changes it."""
    import impl.train
    from impl.config import resolve

    monkeypatch.setattr(
        impl.train, "pick_device", lambda name: torch.device("cpu" if name == "auto" else name)
    )
    saved = resolve("smoke", device="auto")
    assert cli._is_saved_value("device", "cpu", saved, "r") is True
    assert cli._is_saved_value("device", "meta", saved, "r") is False


def test_an_option_of_several_other_methods_names_them_all(monkeypatch):
    import impl.methods

    @dataclasses.dataclass
    class Shared(MethodConfig):
        ratio: float = 0.5

    owners = {"dense": impl.methods.method_class("dense"), "alpha": None, "beta": None}
    monkeypatch.setattr(impl.methods, "available_methods", lambda: list(owners))
    monkeypatch.setattr(
        impl.methods,
        "method_class",
        lambda name: owners[name] or type(name, (), {"Config": Shared}),
    )
    assert cli._other_methods_options(["--ratio", "0.2", "--nope"], "dense") == (
        "--ratio is an option of --method alpha or beta, not of --method dense"
    )


@pytest.mark.parametrize("resumed", [False, True], ids=["new-run", "resume"])
def test_the_worker_gets_the_progress_data_dir_and_timeout_given(
    resumed, tmp_path, monkeypatch, capsys
):
    """--no-progress, --data-dir (of a resumed run) and --dist-timeout reach the training
    itself, under torchrun (where --dist-timeout applies without --nproc)."""
    import impl.train
    from impl import distributed, rundir
    from impl.config import resolve

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    seen = {}

    def run_worker(fn, device, timeout_s=None, **kwargs):
        seen.update(timeout=timeout_s, device=device)
        return fn()

    def train(cfg, progress=True):
        seen.update(progress=progress, out=cfg.out)
        return {"method": "dense"}

    def resume(run_dir, progress=True, data_dir=None):
        seen.update(progress=progress, out=str(run_dir), data_dir=data_dir)
        return {"method": "dense"}

    monkeypatch.setattr(distributed, "run_worker", run_worker)
    monkeypatch.setattr(impl.train, "train", train)
    monkeypatch.setattr(impl.train, "resume", resume)
    run = tmp_path / "run"
    flags = ["--dist-timeout", "7", "--no-progress"]
    if resumed:
        run.mkdir()
        saved = resolve("smoke", out=str(run), device="cpu")  # the run's own device
        rundir.write_json(run / rundir.CONFIG_FILE, saved.to_dict())
        argv = ["train", "--resume", str(run), "--data-dir", str(tmp_path / "moved"), *flags]
        expected = {"timeout": 7.0, "progress": False, "out": str(run), "device": "cpu",
                    "data_dir": str(tmp_path / "moved")}  # fmt: skip
    else:
        argv = ["train", "--scale", "smoke", "--out", str(run), *flags]
        expected = {"timeout": 7.0, "progress": False, "out": str(run), "device": "auto"}
    assert cli.main(argv) == 0
    assert seen == expected
    assert f"results: {run}/summary.json" in capsys.readouterr().out


def test_the_result_line_says_what_the_summary_holds_and_a_question_mark_for_what_it_lacks(
    capsys, tmp_path
):
    summary = {"method": "sdgp", "model": "resnet20", "data": "digits", "scale": "smoke",
               "top1": 91.234, "fwd_ms": 1.5, "bwd_ms": "n/a", "wall_seconds": 12.0}  # fmt: skip
    cli._print_result(tmp_path, summary)
    assert capsys.readouterr().out.splitlines() == [
        "sdgp resnet20 on digits [smoke]: top-1 91.23%, compression 1.00x, fwd 1.5 ms, "
        "bwd ? ms per iteration (last epoch's medians), 12.0 s",
        f"results: {tmp_path}/summary.json (metrics.jsonl, config.json, checkpoint.pt)",
    ]


def test_the_result_line_is_printed_by_rank_0_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    cli._print_result(tmp_path, {"method": "dense"})
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    cli._print_result(tmp_path, {"method": "dense"})
    assert f"results: {tmp_path}/summary.json" in capsys.readouterr().out


def test_a_finished_run_to_resume_is_announced_by_rank_0_only(tmp_path, monkeypatch, capsys):
    import impl.train

    summary = {"status": "complete"}
    monkeypatch.setattr(impl.train, "finished_summary_to_resume", lambda run_dir: summary)
    monkeypatch.setattr("impl.run_files.summary_fields_wrong", lambda s: "")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert cli._finished_run_to_resume(tmp_path) is summary
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    assert cli._finished_run_to_resume(tmp_path) is summary
    assert (
        capsys.readouterr().out
        == f"{tmp_path} holds a finished run: its result (nothing trained)\n"
    )


def test_eval_fgsm_checks_every_run_first_and_passes_on_its_device_and_data_dir(
    tmp_path, monkeypatch, capsys
):
    import impl.robustness
    import impl.train

    calls = []
    monkeypatch.setattr(impl.robustness, "check_attackable", lambda d: calls.append(("check", d)))
    monkeypatch.setattr(impl.train, "pick_device", lambda name: torch.device("cuda", 3))

    def attack(run_dir, eps, device, data_dir):
        calls.append(("attack", run_dir, device, data_dir))
        return [{"eps": e, "top1": 12.5} for e in eps]

    monkeypatch.setattr(impl.robustness, "eval_fgsm_run", attack)
    argv = ["eval-fgsm", "a", "b", "--eps", "0", "0.25", "--device", "cuda:3", "--data-dir", "d"]
    assert cli.main(argv) == 0
    assert calls == [("check", "a"), ("check", "b"), ("attack", "a", "cuda:3", "d"),
                     ("attack", "b", "cuda:3", "d")]  # fmt: skip
    assert capsys.readouterr().out.splitlines() == [
        "a: eps 0: top-1 12.50%", "a: eps 0.25: top-1 12.50%",
        "b: eps 0: top-1 12.50%", "b: eps 0.25: top-1 12.50%",
    ]  # fmt: skip
    calls.clear()  # a run named twice, in two spellings, is attacked once (its first)
    assert cli.main(["eval-fgsm", "a", "b", "./a/", "a", "--device", "cpu"]) == 0
    assert [c[:2] for c in calls] == [("check", "a"), ("check", "b"), ("attack", "a"),
                                      ("attack", "b")]  # fmt: skip


@pytest.mark.parametrize("scale", ["gpu", "paper"])
def test_demo_runs_the_cpu_scales_only(scale, monkeypatch, capsys):
    import reproductions

    monkeypatch.setattr(reproductions, "demo", lambda **kw: pytest.fail("the demo ran"))
    with pytest.raises(SystemExit) as stop:
        cli.main(["demo", "--scale", scale])
    assert stop.value.code == cli.EXIT_USAGE
    assert f"argument --scale: invalid choice: '{scale}'" in capsys.readouterr().err


@pytest.mark.parametrize("failed", [[], ["sdgp.table1"]], ids=["all-done", "one-failed"])
def test_demo_passes_its_options_on_and_exits_1_when_a_target_failed(failed, monkeypatch, capsys):
    import reproductions

    seen = {}

    def demo(**kwargs):
        seen.update(kwargs)
        kwargs["failed"].extend(failed)

    monkeypatch.setattr(reproductions, "demo", demo)
    assert cli.main(["demo", "--scale", "smoke", "--jobs", "2", "--threads", "1"]) == len(failed)
    assert {k: v for k, v in seen.items() if k != "failed"} == {
        "scale": "smoke", "out": "reports", "runs_root": "runs/reproductions", "jobs": 2,
        "progress": True, "threads": 1,
    }  # fmt: skip


def test_ctrl_c_before_an_unknown_command_is_named_says_only_pdtbench(monkeypatch, capsys):
    def stopped(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_main", stopped)
    assert cli.main(["frobnicate"]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "pdtbench: interrupted\n"
    assert cli.main(["env"]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "pdtbench env: interrupted\n"

    def terminated(argv):  # SIGTERM as early: the shell's status for it, 143
        raise cli.Terminated

    monkeypatch.setattr(cli, "_main", terminated)
    assert cli.main(["env"]) == 143
    assert capsys.readouterr().err == "pdtbench env: interrupted\n"


@pytest.mark.parametrize("setting, shown", [("1", True), ("0", False)])
def test_the_traceback_of_an_error_is_printed_only_when_the_variable_is_1(
    setting, shown, monkeypatch, capsys
):
    def failing(argv):
        raise OSError("disk gone")

    monkeypatch.setitem(cli.COMMANDS, "report", failing)
    monkeypatch.setenv(cli.TRACEBACK_VARIABLE, setting)
    assert cli.main(["report"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.endswith("pdtbench report: error: disk gone\n")
    assert ("Traceback (most recent call last)" in err) is shown


@pytest.mark.parametrize(
    "stop, code",
    [(KeyboardInterrupt, 130), (cli.Terminated, 143)],
    ids=["ctrl-c", "sigterm"],
)
def test_a_command_stopped_by_a_signal_exits_with_the_shells_status_for_it(
    stop, code, monkeypatch, capsys, tmp_path
):
    """Ctrl-C exits 130 and SIGTERM 143, whether the command or the training was stopped."""
    import impl.train

    def stopped(*args, **kwargs):
        raise stop

    monkeypatch.setitem(cli.COMMANDS, "report", stopped)
    assert cli.main(["report"]) == code
    assert capsys.readouterr().err == "pdtbench report: interrupted\n"
    monkeypatch.setattr(impl.train, "train", stopped)
    assert cli.main([*SMOKE, "--out", str(tmp_path / "r")]) == code
    assert "interrupted before the run began" in capsys.readouterr().err


def test_a_broken_pipe_while_the_reader_is_still_there_is_raised(monkeypatch):
    """Only a reader that left turns a broken pipe into a quiet exit 141; another broken
    pipe is a real error."""

    def broken(argv):
        raise BrokenPipeError("another pipe")

    monkeypatch.setattr(cli, "_main", broken)
    monkeypatch.setattr(cli, "stdout_reader_gone", lambda: False)
    with pytest.raises(BrokenPipeError):
        cli.main(["report"])


def test_a_module_attribute_that_is_no_exception_class_is_not_caught(monkeypatch):
    import sys
    import types

    module = types.ModuleType("impl.train")
    module.RunExistsError = int  # a class, but no exception
    monkeypatch.setitem(sys.modules, "impl.train", module)
    assert cli._raised_by_loaded(("impl.train", "RunExistsError")) == ()


def test_field_help_stops_where_the_args_section_ends():
    class Cfg:
        """A config.

        Args:
            alpha: the first.
                More on it.

        Returns:
            beta: not a field.
        """

    assert cli.field_help(Cfg) == {"alpha": "the first. More on it."}


def test_field_help_joins_a_wrapped_line_at_the_entrys_depth_even_with_a_colon():
    class Cfg:
        """A config.

        Args:
            alpha: the ratio of
            Table 2 (CIFAR-10: 0.5).
            beta: the second.
        """

    assert cli.field_help(Cfg) == {
        "alpha": "the ratio of Table 2 (CIFAR-10: 0.5).",
        "beta": "the second.",
    }


@pytest.mark.parametrize("text, value", [("false", False), ("no", False), ("true", True)])
def test_a_method_boolean_flag_reads_false_words_as_false(text, value):
    @dataclasses.dataclass
    class Cfg(MethodConfig):
        dynamic_batch: bool = True

    parser = argparse.ArgumentParser()
    cli.add_method_arguments(parser, Cfg)
    assert parser.parse_args(["--dynamic-batch", text]).method__dynamic_batch is value


def test_a_steps_per_epoch_flag_with_resume_repeats_the_saved_number_only():
    """--max-steps-per-epoch 3 repeats a smoke run (3 steps an epoch); 5 changes it."""
    from impl.config import resolve

    smoke = resolve("smoke")
    assert cli._is_saved_value("max_steps_per_epoch", 3, smoke, "r") is True
    assert cli._is_saved_value("max_steps_per_epoch", 5, smoke, "r") is False
    # "every batch" repeats a run saved without a cap only
    assert cli._is_saved_value("max_steps_per_epoch", cli.EVERY_BATCH, smoke, "r") is False
    uncapped = dataclasses.replace(smoke, max_steps_per_epoch=None)
    assert cli._is_saved_value("max_steps_per_epoch", cli.EVERY_BATCH, uncapped, "r") is True


@pytest.mark.parametrize("error", [ValueError, RuntimeError])
def test_resume_with_a_device_this_machine_cannot_pick_changes_the_run(error, monkeypatch):
    """A device that cannot be picked here (no such GPU, a bad name) is no repeat of the
    saved one: it is refused as a change, not raised."""
    import impl.train
    from impl.config import resolve

    def pick_device(name):
        if name == "cuda:7":
            raise error("no cuda:7 here")
        return torch.device("cpu")

    monkeypatch.setattr(impl.train, "pick_device", pick_device)
    assert cli._is_saved_value("device", "cuda:7", resolve("smoke", device="auto"), "r") is False


def test_the_result_line_is_followed_by_the_note_a_reader_should_not_miss(capsys, tmp_path):
    summary = {"method": "dense", "model": "resnet20", "data": "synthetic", "scale": "smoke",
               "top1": 10.0, "compression_ratio": 2.5, "fwd_ms": 1.0, "bwd_ms": 2.0,
               "wall_seconds": 3.0, "data_synthetic": True}  # fmt: skip
    cli._print_result(tmp_path, summary)
    assert capsys.readouterr().out.splitlines() == [
        "dense resnet20 on synthetic [smoke]: top-1 10.00%, compression 2.50x, fwd 1.0 ms, "
        "bwd 2.0 ms per iteration (last epoch's medians), 3.0 s",
        f"results: {tmp_path}/summary.json (metrics.jsonl, config.json, checkpoint.pt)",
        "note: synthetic data (random labels): the top-1 is meaningless; use it for timing only",
    ]


def test_resume_under_nproc_checks_the_moved_data_once_and_names_its_own_resume_command(
    tmp_path, monkeypatch, capsys
):
    """--resume with --nproc 2 checks the run (with the --data-dir it was given) before
    torchrun starts; stopped, it names the same resume with its processes and timeout."""
    import impl.train
    from impl import distributed, rundir
    from impl.config import resolve

    checked = []
    monkeypatch.setattr(impl.train, "check_before_workers", lambda *args: checked.append(args))

    def launch(argv, nproc, **kwargs):
        assert checked, "torchrun started before the run was checked"
        raise KeyboardInterrupt

    monkeypatch.setattr(distributed, "launch", launch)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    run, moved = tmp_path / "run", tmp_path / "moved"
    run.mkdir()
    rundir.write_json(
        run / rundir.CONFIG_FILE, resolve("smoke", out=str(run), device="cpu").to_dict()
    )
    argv = ["train", "--resume", str(run), "--nproc", "2", "--dist-timeout", "7.5",
            "--data-dir", str(moved)]  # fmt: skip
    assert cli.main(argv) == cli.EXIT_INTERRUPTED
    assert checked == [(None, str(run), str(moved))]
    assert capsys.readouterr().err.strip() == (
        f"pdtbench train: interrupted; no epoch had finished: continue with "
        f"`pdtbench train --resume {run} --nproc 2 --dist-timeout 7.5`"
    )


def test_ctrl_c_in_a_resumed_run_names_the_same_resume(tmp_path, monkeypatch, capsys):
    """A resume of one process, stopped, names `--resume RUN` alone: no --nproc it was not
    given."""
    import impl.train
    from impl import rundir
    from impl.config import resolve

    def stopped(run_dir, progress=True, data_dir=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(impl.train, "resume", stopped)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    rundir.write_json(
        run / rundir.CONFIG_FILE, resolve("smoke", out=str(run), device="cpu").to_dict()
    )
    assert cli.main(["train", "--resume", str(run)]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == (
        f"pdtbench train: interrupted; no epoch had finished: continue with "
        f"`pdtbench train --resume {run}`"
    )


@pytest.mark.parametrize("flag", ["--resume", "--method"])
def test_a_flag_of_train_without_its_value_is_train_s_one_line_error(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", flag])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"pdtbench train: error: argument {flag}: expected one argument (see pdtbench train --help)"
    )


def test_nesterov_with_no_momentum_is_refused_naming_both(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--scale", "smoke", "--momentum", "0", "--nesterov", "--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--no-progress"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--nesterov is a kind of momentum, and --momentum is 0 (none)" in err
    assert not out.exists()
    # a momentum, or no --nesterov typed, is no conflict
    parser = cli._train_parser(None)
    for given in (["--momentum", "0.5", "--nesterov"], ["--momentum", "0"], ["--nesterov"]):
        assert cli._conflicting_flags(parser.parse_args(given), "dense", False) == ""


@pytest.mark.parametrize("command", [["train", "--scale", "smoke"], ["eval-fgsm", "run"]])
def test_an_empty_data_dir_is_refused_not_read_as_the_current_directory(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([*command, "--data-dir", ""])
    assert exc.value.code == 2
    assert "argument --data-dir: needs a directory; got an empty one" in capsys.readouterr().err


def test_no_progress_says_it_also_hides_the_epoch_lines():
    help_text = cli._train_parser(None).format_help()
    assert "no progress bar and no line per epoch" in " ".join(help_text.split())
