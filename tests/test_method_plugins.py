"""Methods of one's own: registration (in-process, environment variable, entry points) and the
worked example of docs/new-method.md (examples/gradual_magnitude.py) trained end to end."""

from __future__ import annotations

import dataclasses
import json
from importlib import metadata
from pathlib import Path

import pytest
import torch

import impl.methods as registry
from impl import cli
from impl.config import resolve
from impl.methods import (
    METHODS,
    Method,
    MethodConfig,
    available_methods,
    create_method,
    method_class,
    register_method,
    unregister_method,
)
from impl.train import train

REPO = Path(__file__).resolve().parents[1]
TARGET = "examples.gradual_magnitude:GradualMagnitude"


@pytest.fixture
def examples_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    monkeypatch.delenv(registry.ENV_VAR, raising=False)


@pytest.fixture
def gmp_env(examples_importable, monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, f"gmp={TARGET}")


@dataclasses.dataclass
class _TinyConfig(MethodConfig):
    strength: float = 1.0


class _Tiny(Method):
    name = "tiny"
    Config = _TinyConfig


# -- registration -----------------------------------------------------------------------------


def test_register_method_makes_a_class_trainable_by_name_and_unregister_forgets_it(
    examples_importable,
):
    register_method("tiny", _Tiny)
    try:
        assert available_methods()[: len(METHODS)] == METHODS  # built-ins first, unchanged
        assert "tiny" in available_methods()
        assert method_class("tiny") is _Tiny
        assert create_method("tiny", {"strength": 2.0}).config.strength == 2.0
        with pytest.raises(ValueError, match="already registered"):
            register_method("tiny", _Tiny)
        register_method("tiny", TARGET, replace=True)  # a string target, imported when used
        assert method_class("tiny").__name__ == "GradualMagnitude"
    finally:
        unregister_method("tiny")
    assert "tiny" not in available_methods()
    with pytest.raises(ValueError, match="unknown method 'tiny'; valid methods: dense"):
        method_class("tiny")
    with pytest.raises(ValueError, match=r"'ClickTrain' \(did you mean 'clicktrain'\?\); valid"):
        method_class("ClickTrain")


class _NotAMethod:
    pass


class _BadConfig(Method):
    Config = dict  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("name", "target", "error", "match"),
    [
        ("Tiny", _Tiny, ValueError, "lower case"),
        ("2x", _Tiny, ValueError, "lower case"),
        ("dense", _Tiny, ValueError, "built-in"),
        ("tiny", "examples.gradual_magnitude", ValueError, "package.module:ClassName"),
        ("tiny", _NotAMethod, TypeError, "not a subclass"),
        ("tiny", _BadConfig, TypeError, "must be a dataclass"),
    ],
    ids=["upper_case", "leading_digit", "builtin_name", "no_class", "not_method", "bad_config"],
)
def test_register_method_rejects_bad_names_and_targets(name, target, error, match):
    with pytest.raises(error, match=match):
        register_method(name, target)
    assert name not in registry._REGISTERED


def test_environment_variable_registers_methods_for_every_process(gmp_env, monkeypatch):
    assert "gmp" in available_methods()
    assert method_class("gmp").name == "gmp"
    monkeypatch.setenv(registry.ENV_VAR, "gmp")
    with pytest.raises(ValueError, match="name=package.module:ClassName"):
        available_methods()
    # a built-in name is never shadowed, nor the attempt ignored: training dense (or any
    # built-in) with the variable set so is an error, as is a malformed variable
    monkeypatch.setenv(registry.ENV_VAR, "dense=examples.gradual_magnitude:GradualMagnitude")
    with pytest.raises(ValueError, match="'dense' is a built-in method and cannot be replaced"):
        method_class("dense")
    monkeypatch.setenv(registry.ENV_VAR, "gmp")
    with pytest.raises(ValueError, match="name=package.module:ClassName"):
        method_class("sdgp")
    # one name for two classes: the last one won, silently
    gmp = "gmp=examples.gradual_magnitude:GradualMagnitude"
    monkeypatch.setenv(registry.ENV_VAR, f"{gmp},gmp=mine:Mine")
    with pytest.raises(ValueError, match=r"'gmp' is given twice \(examples.gradual_magnitude:"):
        available_methods()
    monkeypatch.setenv(registry.ENV_VAR, f"{gmp}, {gmp}")  # the same twice is one entry
    assert method_class("gmp").name == "gmp"
    monkeypatch.delenv(registry.ENV_VAR)
    assert method_class("dense").__name__ == "Dense"


def test_a_registered_target_that_does_not_import_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, "ghost=no_such_package.mod:Ghost,nocls=impl.train:Nope")
    with pytest.raises(ValueError, match="cannot import 'no_such_package.mod'"):
        method_class("ghost")
    with pytest.raises(ValueError, match="has no 'Nope'"):
        method_class("nocls")


def test_entry_points_of_installed_packages_register_methods(examples_importable, monkeypatch):
    point = metadata.EntryPoint(name="gmp_ep", value=TARGET, group=registry.ENTRY_POINT_GROUP)
    seen = []

    def fake_entry_points(*, group):
        seen.append(group)
        return [point]

    monkeypatch.setattr(registry.metadata, "entry_points", fake_entry_points)
    assert "gmp_ep" in available_methods() and seen == [registry.ENTRY_POINT_GROUP]
    assert method_class("gmp_ep").__name__ == "GradualMagnitude"


# -- the worked example ---------------------------------------------------------------------------


def test_cubic_schedule_runs_from_initial_to_final_sparsity(examples_importable):
    from examples.gradual_magnitude import cubic_sparsity

    values = [cubic_sparsity(t, 10, 20, 0.1, 0.8) for t in (5, 10, 12, 15, 20, 30)]
    assert values[0] == values[1] == pytest.approx(0.1)
    assert values[-2] == values[-1] == pytest.approx(0.8)
    assert values[2] < values[3] < values[4]  # rising, fastest at the start (cubic)
    assert values[2] - values[1] > values[4] - values[3]


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.9, 0.99], ids=["s0", "s50", "s90", "s99"])
def test_magnitude_keep_mask_keeps_the_largest_weights(examples_importable, sparsity):
    from examples.gradual_magnitude import magnitude_keep_mask

    w = torch.randn(7, 5, 3, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    keep = magnitude_keep_mask(w, sparsity)
    assert keep.shape == w.shape and keep.dtype == torch.bool
    assert int(keep.sum()) == round((1 - sparsity) * w.numel())
    if 0 < int(keep.sum()) < w.numel():
        assert w.abs()[keep].min() >= w.abs()[~keep].max()


@pytest.mark.slow
def test_gradual_magnitude_trains_to_its_final_sparsity_and_fixes_the_masks(gmp_env, tmp_path):
    options = {"final_sparsity": 0.75, "start": 0.2, "end": 0.7, "interval": 1}
    cfg = resolve("smoke", method="gmp", model="resnet20", data="digits", epochs=3,
                  out=str(tmp_path / "gmp"), threads=1, method_options=options)  # fmt: skip
    summary = train(cfg, progress=False)
    assert summary["status"] == "complete" and summary["method"] == "gmp"
    assert summary["method_class"] == TARGET  # the code behind the name, for provenance
    layers = summary["gmp"]["layer_sparsity"]
    assert summary["gmp"]["fixed"] is True
    # ResNet-20: the stem, 18 convs in blocks and 2 1x1 shortcuts; all but the stem pruned
    assert len(layers) == 20 and "conv1.weight" not in layers
    for name, sparsity in layers.items():
        assert sparsity == pytest.approx(0.75, abs=0.01), name
    assert summary["compression_ratio"] > 3.0  # the stem and 1x1 shortcuts are small
    assert summary["train_flops_nominal"] < summary["train_flops_executed"]
    # The Trainer writes each epoch's cost, so the whole run counts the dense early steps.
    from impl.rundir import read_metrics
    from reproductions.common import run_training_flops, samples_seen

    metrics = read_metrics(tmp_path / "gmp")
    per_epoch = [m["train_flops_nominal"] for m in metrics]
    assert per_epoch == sorted(per_epoch, reverse=True) and per_epoch[0] > per_epoch[-1]
    assert all(m["train_flops_executed"] == summary["train_flops_executed"] for m in metrics)
    whole_run = run_training_flops(summary, metrics)
    assert whole_run > summary["train_flops_nominal"] * samples_seen(metrics)


def test_gradual_magnitude_state_round_trips(gmp_env):
    method = create_method("gmp", {"final_sparsity": 0.5})
    method.masks.set("a.weight", torch.tensor([True, False]))
    method.target, method.fixed = 0.5, True
    again = create_method("gmp")
    again.load_state_dict(method.state_dict(), ctx=None)  # type: ignore[arg-type]
    assert torch.equal(again.masks["a.weight"], torch.tensor([True, False]))
    assert (again.target, again.fixed) == (0.5, True)


def test_cli_trains_a_registered_method_with_its_config_fields_as_flags(gmp_env, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--method", "gmp", "--final-sparsity", "0.5", "--interval", "1"]
    assert cli.main([*argv, "--scale", "smoke", "--out", str(run), "--threads", "1"]) == 0
    import json

    config = json.loads((run / "config.json").read_text())
    assert config["method"] == "gmp"
    assert config["method_options"] == {"final_sparsity": 0.5, "interval": 1}
    capsys.readouterr()
    # a flag the example's config does not have (another method's): refused, naming its owner
    argv = ["train", "--method", "gmp", "--penalty-ratio", "0.2", "--out", str(run)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--penalty-ratio is an option of --method prunetrain, not of --method gmp" in err
    # an option two methods have: both are named
    assert cli.main(["train", "--final-sparsity", "0.5", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "--final-sparsity is an option of --method campfire or gmp, not of --method dense" in err
    with pytest.raises(SystemExit):  # a flag no method has: argparse's own refusal
        cli.main(["train", "--method", "gmp", "--no-such-flag", "1", "--out", str(run)])


def test_cross_method_table_gives_every_registered_method_a_row(gmp_env):
    from reproductions.cross import methods as cross

    rows = cross.rows("cpu")
    assert [r.label for r in rows] == [*cross.METHOD_ORDER, "gmp"]
    gmp = rows[-1]
    assert gmp.method == "gmp" and gmp.baseline == "dense" and gmp.options == {}
    assert gmp.seeds == rows[0].seeds and gmp.train == rows[0].train  # equal terms
    assert any("gmp" in note for note in cross.notes("cpu"))


def test_cross_method_table_without_registered_methods_has_the_five(examples_importable):
    from reproductions.cross import methods as cross

    assert [r.label for r in cross.rows("cpu")] == list(cross.METHOD_ORDER)
    assert not any("Registered" in note for note in cross.notes("cpu"))


@dataclasses.dataclass
class _ClashConfig(MethodConfig):
    lr: float = 0.1  # pdtbench train has its own --lr


class _Clash(Method):
    name = "clash"
    Config = _ClashConfig


def test_a_plugin_option_named_like_a_train_flag_is_a_one_line_usage_error(capsys):
    register_method("clash", _Clash)
    try:
        assert cli.main(["train", "--method", "clash", "--help"]) == 2
    finally:
        unregister_method("clash")
    err = capsys.readouterr().err.strip()
    assert "option 'lr' of _ClashConfig clashes with pdtbench train's own --lr" in err
    assert len(err.splitlines()) == 1


def test_entry_points_with_a_nested_class_load_and_malformed_ones_are_skipped(
    examples_importable, monkeypatch, caplog
):
    group = registry.ENTRY_POINT_GROUP
    points = [
        metadata.EntryPoint(name="nested", value="tests_nested_mod:Outer.Inner", group=group),
        metadata.EntryPoint(name="broken", value="no_colon_here", group=group),
        metadata.EntryPoint(name="Bad-Name", value=TARGET, group=group),
    ]
    monkeypatch.setattr(registry.metadata, "entry_points", lambda *, group: points)
    import sys
    import types

    module = types.ModuleType("tests_nested_mod")

    class Outer:
        Inner = _Tiny

    module.Outer = Outer
    monkeypatch.setitem(sys.modules, "tests_nested_mod", module)
    with caplog.at_level("WARNING"):
        names = available_methods()
    assert "nested" in names and "broken" not in names and "Bad-Name" not in names
    assert method_class("nested") is _Tiny
    assert sum("ignoring entry point" in r.message for r in caplog.records) == 2


def test_a_plugin_that_does_not_import_says_why_in_the_reproduction(tmp_path, monkeypatch):
    from reproductions.common import MethodUnavailable, run_or_reuse

    monkeypatch.setenv(registry.ENV_VAR, "ghost=no_such_package.mod:Ghost")
    cfg = resolve("smoke", method="ghost", out=str(tmp_path / "run"), threads=1)
    with pytest.raises(MethodUnavailable, match="cannot import 'no_such_package.mod'"):
        run_or_reuse(cfg)


def test_a_plugin_that_does_not_import_makes_reproduce_exit_1_naming_its_row(
    tmp_path, monkeypatch, capsys
):
    """A registered method that cannot be built is a failure of the command, not a row "not
    available" as a built-in method this build leaves out: the report is rendered, the
    command names the row and exits 1."""
    import reproductions
    from reproductions.common import Row, Target

    monkeypatch.setenv(registry.ENV_VAR, "ghost=no_such_package.mod:Ghost")
    target = Target(key="cross.methods", title="t", description="d",
                    rows=lambda scale: [Row("ghost", "ghost", train={"epochs": 1})])  # fmt: skip
    monkeypatch.setattr(reproductions, "load_target", lambda key: target)
    monkeypatch.setattr(reproductions, "expected_targets", lambda scale="cpu": [])
    argv = ["cross.methods", "--scale", "smoke", "--runs-root", str(tmp_path / "runs"),
            "--out", str(tmp_path / "rep"), "--no-progress", "--jobs", "1"]  # fmt: skip
    assert cli.main(["reproduce", *argv]) == 1
    out = capsys.readouterr().out
    assert "1 target(s) failed: cross.methods (1 row(s): ghost)" in out
    assert "report: " in out and (tmp_path / "rep" / "index.html").exists()


def test_the_snippet_of_docs_new_method_defines_a_registrable_method():
    import re

    text = (REPO / "docs" / "new-method.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/new-method.md", "exec"), namespace)  # the page's own example
    register_method("mine", namespace["MyMethod"])
    try:
        method = create_method("mine", {"final_sparsity": 0.5})
        assert method.config.final_sparsity == 0.5 and method.name == "mine"
        assert cli.field_help(namespace["MyConfig"]) == {
            "final_sparsity": "fraction of each layer's weights removed at the end."
        }
    finally:
        unregister_method("mine")


# -- runs of a method that has changed ----------------------------------------------------------


def test_a_built_in_name_in_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, "dense=examples.gradual_magnitude:GradualMagnitude")
    with pytest.raises(ValueError, match="'dense' is a built-in method and cannot be replaced"):
        available_methods()


def test_method_source_digest_reads_the_file_that_defines_the_class(tmp_path):
    digest = registry.method_source_digest(_Tiny)
    assert digest is not None and len(digest) == 16
    assert registry.method_source_digest(_Tiny) == digest  # a property of the file
    assert registry.method_source_digest(int) is None  # no source file
    assert registry.is_builtin("dense") and not registry.is_builtin("tiny")


PLUGIN = """
import dataclasses
from impl.methods import Method, MethodConfig


@dataclasses.dataclass
class MineConfig(MethodConfig):
    pass


class Mine(Method):
    name = "mine"
    Config = MineConfig
    VERSION = {version}
"""


@pytest.fixture
def edit_mine(tmp_path, monkeypatch):
    """Register the plug-in ``mine`` (PLUGIN at version 1, in a fresh module); the returned
    function rewrites its source at another version, as a user editing their method."""
    import importlib
    import sys

    monkeypatch.delitem(sys.modules, "mine_method", raising=False)  # another test's copy
    pkg = tmp_path / "src"
    pkg.mkdir()
    (pkg / "mine_method.py").write_text(PLUGIN.format(version=1))
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.setenv(registry.ENV_VAR, "mine=mine_method:Mine")

    def edit(version: int) -> None:
        (pkg / "mine_method.py").write_text(PLUGIN.format(version=version))
        sys.modules.pop("mine_method", None)
        importlib.invalidate_caches()

    return edit


def test_a_run_of_a_registered_method_whose_code_changed_is_trained_again(
    tmp_path, edit_mine, capsys
):
    from reproductions.common import reusable_summary, run_or_reuse

    cfg = resolve("smoke", method="mine", epochs=1, max_steps_per_epoch=1, threads=1)
    cfg.out = str(tmp_path / "runs" / "mine")
    summary, reused = run_or_reuse(cfg)
    assert not reused and summary["method_source_sha256"]
    assert run_or_reuse(cfg)[1] is True  # unchanged: reused
    # the user edits their method: the old run no longer stands for it
    edit_mine(2)
    assert reusable_summary(tmp_path / "runs" / "mine", "mine") is None
    capsys.readouterr()
    summary2, reused2 = run_or_reuse(cfg)
    assert not reused2 and summary2["method_source_sha256"] != summary["method_source_sha256"]
    err = capsys.readouterr().err
    assert "the source of mine_method:Mine has changed since it was trained" in err
    assert len(list((tmp_path / "runs").glob("mine.stale-*"))) == 1  # kept, not deleted


def test_train_refuses_to_print_the_result_of_a_registered_method_whose_code_changed(
    tmp_path, edit_mine, monkeypatch, capsys
):
    """The same ``pdtbench train`` command again prints a finished run's result when this
    commit trained it; a plug-in outside the repository changes no commit, so its source
    digest decides: an edited method's old result is refused, naming why."""
    import impl.env
    from impl import cli
    from impl.methods import method_class, method_identity

    monkeypatch.setattr(impl.env, "collect", lambda gpu=None: {"commit": "c" * 40})
    summary = {"status": "complete", "environment": {"commit": "c" * 40}, "device": "cpu"}
    summary.update(method_identity(method_class("mine")))
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert cli._same_finished_run(tmp_path, 1, "cpu", "mine") == summary
    assert "already holds this config's finished run" in capsys.readouterr().out
    edit_mine(2)
    with pytest.raises(cli.UsageError, match="the source of mine_method:Mine has changed"):
        cli._same_finished_run(tmp_path, 1, "cpu", "mine")
    assert "already holds" not in capsys.readouterr().out


def test_reproduce_says_why_a_finished_run_is_trained_again_and_not_that_it_resumes(
    tmp_path, edit_mine
):
    """The worker's "not reusing" line went to the run's log only, and the console said the
    run went on "from a checkpoint" (the finished run's), though it was trained anew."""
    from reproductions.common import run_or_reuse
    from reproductions.parallel import PlannedRun, train_all

    cfg = resolve("smoke", method="mine", epochs=1, max_steps_per_epoch=1, threads=1)
    cfg.out = str(tmp_path / "runs" / "mine")
    run_or_reuse(cfg)
    edit_mine(2)
    lines: list[str] = []
    handed: list[str] = []

    def worker(job):
        handed.append(str(job[0].out))
        return str(job[0].out), None, 0.0

    plan = [PlannedRun(config=cfg, targets=["cross.methods"])]
    assert train_all(plan, 1, log=lines.append, progress=False, worker=worker) == {}
    assert handed == [cfg.out]
    assert lines[0].startswith(
        "not reusing mine: the source of mine_method:Mine has changed since it was trained"
    ) and lines[0].endswith("; it is moved aside and trained again")
    assert lines[1].startswith("training 1 run (0 of 1 already complete) in 1 process")


def test_a_killed_run_of_a_method_whose_code_changed_is_not_continued(tmp_path, edit_mine, capsys):
    from impl.rundir import SUMMARY_FILE, StaleRunError, load_checkpoint
    from impl.train import resume
    from reproductions.common import run_or_reuse

    cfg = resolve("smoke", method="mine", epochs=1, max_steps_per_epoch=1, threads=1)
    run_dir = tmp_path / "runs" / "mine"
    cfg.out = str(run_dir)
    run_or_reuse(cfg)
    checkpoint = load_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint["method_class"] == "mine_method:Mine"
    (run_dir / SUMMARY_FILE).unlink()  # as if killed after its last checkpoint
    assert run_or_reuse(cfg)[1] is False  # same code: continued in place
    assert not list((tmp_path / "runs").glob("mine.stale-*"))
    (run_dir / SUMMARY_FILE).unlink()
    edit_mine(2)
    with pytest.raises(StaleRunError, match="mine_method:Mine has changed since it was trained"):
        resume(run_dir, progress=False)
    capsys.readouterr()
    assert cli.main(["train", "--resume", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "cannot be continued" in err  # one line, no traceback
    summary, reused = run_or_reuse(cfg)
    assert not reused and summary["method_source_sha256"] != checkpoint["method_source_sha256"]
    assert "has changed since it was trained" in capsys.readouterr().err
    assert len(list((tmp_path / "runs").glob("mine.stale-*"))) == 1


def test_identity_change_names_what_changed():
    identity = registry.method_identity(_Tiny)
    assert identity["method_class"] == f"{__name__}:_Tiny"
    assert registry.identity_change({}, "dense") is None  # built-in: versioned by its commit
    registry.register_method("tiny", _Tiny)
    try:
        assert registry.identity_change(identity, "tiny") is None
        moved = dict(identity, method_class="elsewhere:Tiny")
        assert "it was trained by elsewhere:Tiny" in registry.identity_change(moved, "tiny")
        edited = dict(identity, method_source_sha256="0" * 16)
        assert "has changed" in registry.identity_change(edited, "tiny")
        assert "trained by None" in registry.identity_change({}, "tiny")  # unknown code
    finally:
        registry.unregister_method("tiny")


def test_a_plugin_run_read_without_its_registration_says_how_to_register_it(
    gmp_env, tmp_path, monkeypatch, capsys
):
    from impl.rundir import SUMMARY_FILE
    from impl.train import load_trained_model

    run_dir = tmp_path / "gmp"
    cfg = resolve("smoke", method="gmp", epochs=1, max_steps_per_epoch=1, threads=1)
    cfg.out = str(run_dir)
    train(cfg, progress=False)
    monkeypatch.delenv(registry.ENV_VAR)
    hint = f"was trained with {TARGET}: register it, e.g. {registry.ENV_VAR}=gmp={TARGET}"
    with pytest.raises(ValueError, match="unknown method 'gmp'") as err:  # from the summary
        load_trained_model(run_dir)
    assert hint in str(err.value)
    assert cli.main(["eval-fgsm", str(run_dir), "--eps", "0.1"]) == 2
    out = capsys.readouterr().err.strip()
    assert hint in out and "\n" not in out  # one line
    (run_dir / SUMMARY_FILE).unlink()  # a killed run: the checkpoint names the class
    assert cli.main(["train", "--resume", str(run_dir), "--no-progress"]) == 2
    assert hint in capsys.readouterr().err
