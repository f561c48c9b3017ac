"""Command line: ``pdtbench train | env | demo | eval-fgsm``.

A thin layer over typed functions: it parses, builds a :class:`impl.config.TrainConfig`, and
calls the library. Usage errors (unknown model, method, dataset, bad option) print one line
and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import os
import re
import select
import signal
import sys
import threading
import traceback
import types
import typing
from pathlib import Path
from typing import Any

from impl.cli_parser import OneLineParser, directory, flag_text

EXIT_FAILED = 1  # the work itself failed (training diverged)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a job stopped by kill, Slurm, docker
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a writer whose reader left


class UsageError(Exception):
    """A user error: printed as one line, exit status 2."""


# -- method flags from the method's Config dataclass ----------------------------------------------
def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _or_none(tp: type, none: Any = None) -> Any:
    """``tp`` (int or float) as an argparse type that also takes "none" (any case), read as
    ``none``: by default None, the option's default, which its help names "None". Not for
    str options, where "none" could be a value of their own."""

    def parse(text: str) -> Any:
        return none if text.strip().lower() == "none" else tp(text)

    parse.__name__ = tp.__name__  # argparse's "invalid int value" names the type by it
    return parse


#: ``--max-steps-per-epoch none``: every batch, over a scale's own limit (smoke's 3 steps),
#: where an unset flag (None) takes the scale's.
EVERY_BATCH = "every batch"


def _str2bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def field_help(config_cls: type) -> dict[str, str]:
    """``{field: description}`` from the ``Args:`` section of ``config_cls``'s docstring
    (one ``name: text`` entry per field, continuation lines indented deeper)."""
    doc = inspect.getdoc(config_cls) or ""
    out: dict[str, str] = {}
    in_args, current, indent = False, None, None
    for line in doc.splitlines():
        if line.strip() == "Args:":
            in_args, current, indent = True, None, None
            continue
        if not in_args or not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent:  # the section ended
            break
        name, sep, text = line.strip().partition(":")
        if depth == indent and sep and name.isidentifier():
            current = name
            out[name] = text.strip()
        elif current is not None:
            out[current] += " " + line.strip()
    return out


_ROLE = re.compile(r":(?:func|meth|class|mod|data|attr|obj):`~?([^`]+)`")


def plain_help(text: str) -> str:
    """Docstring markup made terminal text for a flag's help: ``:func:`x``` and the other
    Sphinx roles become ``x``, double backquotes go, and a ``%`` is doubled (argparse
    %-formats help strings)."""
    return _ROLE.sub(r"\1", text).replace("``", "").replace("%", "%%")


def add_method_arguments(parser: argparse.ArgumentParser, config_cls: type) -> list[str]:
    """Add one flag per field of ``config_cls`` (its help from the ``Args:`` docstring);
    return the field names added."""
    hints = typing.get_type_hints(config_cls)
    helps = field_help(config_cls)
    group = parser.add_argument_group(f"options of {config_cls.__name__}")
    names = []
    for f in dataclasses.fields(config_cls):
        tp, optional = _unwrap_optional(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # a list or dict field
            default = f.default_factory()
        else:
            default = None
        help_text = f"{helps.get(f.name, '')} (default: {default})".strip()
        help_text = plain_help(help_text)
        kwargs: dict[str, Any] = {
            "dest": f"method__{f.name}",
            "default": None,
            "help": help_text,
            "metavar": f.name.upper(),
        }
        origin = typing.get_origin(tp)
        if tp is bool:
            kwargs.update(type=_str2bool, metavar="BOOL")  # true/false, yes/no, 1/0
        elif origin in (tuple, list):
            inner = [a for a in typing.get_args(tp) if a is not Ellipsis]
            kwargs.update(nargs="+", type=inner[0] if inner else str)
        elif tp in (int, float, str):
            # an option whose default is None takes "none" too (the same as leaving it out)
            numeric = tp in (int, float)
            kwargs.update(type=_or_none(tp) if numeric and optional and default is None else tp)
        else:
            kwargs.update(type=str)
        try:
            group.add_argument(_flag(f.name), **kwargs)
        except argparse.ArgumentError as err:  # a plug-in's field named like a train flag
            raise UsageError(
                f"option {f.name!r} of {config_cls.__name__} clashes with pdtbench train's own "
                f"{_flag(f.name)}; rename the field"
            ) from err
        names.append(f.name)
    return names


# -- train ---------------------------------------------------------------------------------------
def _train_field_help(name: str, *, default: bool = True) -> str:
    """A train flag's help: the TrainConfig docstring's entry for ``name`` and, with
    ``default``, its default at each scale (a preset's value where it sets one)."""
    from impl.config import SCALE_PRESETS, SCALES, TrainConfig

    text = plain_help(field_help(TrainConfig)[name].rstrip("."))
    if not default:
        return text
    field = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
    base = field.default_factory() if field.default is dataclasses.MISSING else field.default
    per_scale = {scale: SCALE_PRESETS[scale].get(name, base) for scale in SCALES}

    def shown(value: Any) -> str:
        if value is None:
            return "none"
        if isinstance(value, list):
            return " ".join(map(str, value)) or "none"
        return str(value)

    if len({shown(v) for v in per_scale.values()}) == 1:
        return f"{text} (default: {shown(base)})"
    by_scale = ", ".join(f"{scale} {shown(v)}" for scale, v in per_scale.items())
    return f"{text} (default by --scale: {by_scale})"


def _train_parser(method_config: type | None) -> argparse.ArgumentParser:
    from impl.config import AUGMENT_RECIPES, MEMORY_FORMATS, SCALE_HELP, SCALES, SCHEDULES

    p = OneLineParser(
        prog="pdtbench train",
        description="Train one model with one method into a run directory.",
        allow_abbrev=False,  # --m and --n are SDGP's, not prefixes of --method or --nproc
    )
    p.add_argument("--resume", metavar="DIR", help="continue the killed run in DIR")
    p.add_argument(
        "--method",
        default="dense",
        help="dense (the default), clicktrain, prunetrain, sdgp, campfire, or a registered "
        "method (docs/new-method.md); 'pdtbench train --method M --help' lists M's options",
    )
    p.add_argument("--model", help="model name (default from --scale: resnet20)")
    p.add_argument("--stem", choices=["cifar", "imagenet"], help=_train_field_help("stem"))
    p.add_argument("--data", help="dataset (default from --scale: digits)")
    p.add_argument(
        "--data-dir",
        type=directory,
        help="directory of a local dataset (CIFAR, ImageNet), as DIR or NAME=DIR (default: "
        "where the PDTBENCH_DATA_DIR variable says, NAME=DIR or DIR entries joined by ':')",
    )
    p.add_argument(
        "--image-size",
        type=int,
        help="side of the images in pixels, digits and synthetic only (digits: 32 unless "
        "set; the cpu-scale reproductions use 16)",
    )
    p.add_argument("--scale", default="cpu", choices=SCALES, help=f"{SCALE_HELP} (default: cpu)")
    say = _train_field_help
    p.add_argument("--epochs", type=int, help=say("epochs"))
    p.add_argument("--batch-size", type=int, help=say("batch_size"))
    p.add_argument("--lr", type=float, help=say("lr"))
    p.add_argument("--momentum", type=float, help=say("momentum"))
    p.add_argument(
        "--nesterov", action=argparse.BooleanOptionalAction, default=None, help=say("nesterov")
    )
    p.add_argument("--weight-decay", type=float, help=say("weight_decay"))
    p.add_argument("--schedule", choices=SCHEDULES, help=say("schedule"))
    p.add_argument("--milestones", type=int, nargs="+", help=say("milestones"))
    p.add_argument("--gamma", type=float, help=say("gamma"))
    p.add_argument("--warmup-fraction", type=float, help=say("warmup_fraction"))
    p.add_argument("--warmup-start", type=float, help=say("warmup_start"))
    p.add_argument("--label-smoothing", type=float, help=say("label_smoothing"))
    p.add_argument(
        "--no-augment",
        action="store_true",
        help="turn off the " + say("augment", default=False) + ", on by default",
    )
    p.add_argument("--augment-recipe", choices=AUGMENT_RECIPES, help=say("augment_recipe"))
    p.add_argument("--eval-flip", action="store_true", help=say("eval_flip", default=False))
    p.add_argument(
        "--no-bn-weight-decay",
        action="store_true",
        help="no weight decay on BatchNorm weights and biases, as the SDGP authors' CIFAR-10 "
        "script (by default they decay like every parameter)",
    )
    p.add_argument("--seed", type=int, help=say("seed"))
    p.add_argument("--device", help=say("device"))
    amp = p.add_mutually_exclusive_group()
    amp.add_argument("--bf16", action="store_true", help=say("bf16", default=False))
    amp.add_argument("--fp16", action="store_true", help=say("fp16", default=False))
    p.add_argument(
        "--cudnn-benchmark", action="store_true", help=say("cudnn_benchmark", default=False)
    )
    p.add_argument("--tf32", action="store_true", help=say("tf32", default=False))
    p.add_argument("--memory-format", choices=MEMORY_FORMATS, help=say("memory_format"))
    p.add_argument("--threads", type=_or_none(int), help=say("threads", default=False))
    p.add_argument(
        "--max-steps-per-epoch", type=_or_none(int, EVERY_BATCH), help=say("max_steps_per_epoch")
    )
    p.add_argument(
        "--out",
        type=directory,
        help="run directory (default: runs/<method>-<model>-<data>-<scale>-<hash>)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar and no line per epoch on standard error (the run's "
        "metrics.jsonl keeps them)",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="data-parallel processes on this node, launched through torchrun (default 1); "
        "--batch-size stays the global batch",
    )
    p.add_argument(
        "--dist-timeout",
        type=float,
        metavar="SECONDS",
        help="timeout of every collective when distributed, with --nproc N > 1 or under "
        "torchrun (default $PDTBENCH_DIST_TIMEOUT or 300)",
    )
    if method_config is not None:
        add_method_arguments(p, method_config)
    return p


def _as_flag(parser: argparse.ArgumentParser, message: str) -> str:
    """``message`` with a leading config field name ("batch_size must be >= 1") written as
    the option that sets it ("--batch-size must be >= 1"), so a CLI error names what was
    typed; a message that starts with anything else is returned as it is."""
    head, sep, rest = message.partition(" ")
    for action in parser._actions:
        if action.option_strings and head in (action.dest, action.dest.removeprefix("method__")):
            return f"{action.option_strings[0]}{sep}{rest}"
    return message


def _other_methods_options(unknown: list[str], method: str) -> str:
    """For flags ``--x`` that ``method`` does not take but other methods do (their config
    fields), a message naming which methods take them; "" when none is such a flag."""
    flags = dict.fromkeys(t.split("=", 1)[0] for t in unknown if t.startswith("--"))
    if not flags:
        return ""
    from impl.methods import available_methods, method_class

    owners: dict[str, list[str]] = {}
    for name in available_methods():
        if name != method:
            for f in dataclasses.fields(method_class(name).Config):
                owners.setdefault(_flag(f.name), []).append(name)
    return "; ".join(
        f"{flag} is an option of --method {' or '.join(owners[flag])}, not of --method {method}"
        for flag in flags
        if flag in owners
    )


def _resolve_from_args(args: argparse.Namespace, options: dict[str, Any]) -> Any:
    """The run's TrainConfig: the scale's preset, then every flag given (None = not given)."""
    from impl.config import resolve
    from impl.data import dataset_dir_for

    every_batch = args.max_steps_per_epoch == EVERY_BATCH
    cfg = resolve(
        args.scale,
        method=args.method,
        method_options=options,
        model=args.model,
        stem=args.stem,
        data=args.data,
        data_dir=args.data_dir,
        data_options=None if args.image_size is None else {"image_size": args.image_size},
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        momentum=args.momentum,
        nesterov=args.nesterov,
        weight_decay=args.weight_decay,
        schedule=args.schedule,
        milestones=args.milestones,
        gamma=args.gamma,
        warmup_fraction=args.warmup_fraction,
        warmup_start=args.warmup_start,
        label_smoothing=args.label_smoothing,
        augment=False if args.no_augment else None,
        augment_recipe=args.augment_recipe,
        eval_flip=True if args.eval_flip else None,
        bn_weight_decay=False if args.no_bn_weight_decay else None,
        seed=args.seed,
        device=args.device,
        bf16=True if args.bf16 else None,
        fp16=True if args.fp16 else None,
        cudnn_benchmark=True if args.cudnn_benchmark else None,
        tf32=True if args.tf32 else None,
        memory_format=args.memory_format,
        threads=args.threads,
        max_steps_per_epoch=None if every_batch else args.max_steps_per_epoch,
        out=args.out,
    )
    if every_batch:  # over the scale's own limit
        cfg.max_steps_per_epoch = None
    # NAME=DIR, as the variable takes; refused for data not read from a directory
    cfg.data_dir = dataset_dir_for(cfg.data_dir, cfg.data)
    return cfg


def _checked_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    """The run's :class:`impl.config.TrainConfig` from ``pdtbench train``'s flags, checked as
    far as it can be before training (model, dataset, every option, the method's own
    checks), so that a bad flag is one line, once, before torchrun starts any worker."""
    from impl import models
    from impl.data import DATASETS
    from impl.methods import create_method

    if args.model is not None and args.model not in models.MODELS:
        raise UsageError(f"unknown model {args.model!r}; valid models: {', '.join(models.MODELS)}")
    if args.data is not None and args.data not in DATASETS:
        raise UsageError(f"unknown dataset {args.data!r}; valid datasets: {', '.join(DATASETS)}")
    options = {
        k.removeprefix("method__"): v
        for k, v in vars(args).items()
        if k.startswith("method__") and v is not None
    }
    try:  # the method's own checks too, so either names the flag (train() repeats them)
        cfg = _resolve_from_args(args, options)
        create_method(cfg.method, cfg.method_options).validate(cfg)
    except ValueError as err:
        raise UsageError(_as_flag(parser, str(err))) from err
    return cfg


def cmd_train(argv: list[str]) -> int:
    """``pdtbench train``: parse, resolve the config, train, print where the results are."""
    from impl import distributed
    from impl.config import read_config
    from impl.methods import method_class
    from impl.rundir import CONFIG_FILE
    from impl.train import (
        check_before_workers,
        check_run_method,
        check_scale_device,
        resume,
        train,
    )

    # --m is not --method; a missing value is the one-line error of pdtbench train
    pre = OneLineParser(prog="pdtbench train", add_help=False, allow_abbrev=False)
    pre.add_argument("--method")
    pre.add_argument("--resume")
    known, _ = pre.parse_known_args(argv)
    if known.resume is not None and not known.resume.strip():  # e.g. an unset "$RUN"
        raise UsageError("--resume needs a run directory; got an empty one")
    saved_cfg = None
    if known.resume and (Path(known.resume) / CONFIG_FILE).is_file():
        saved_cfg = read_config(Path(known.resume) / CONFIG_FILE)
    method_named = known.method is not None
    if known.method is None:  # a resumed run's own method options are its flags
        known.method = saved_cfg.method if saved_cfg is not None else "dense"
    try:
        if saved_cfg is not None:  # a plug-in's run without its registration: how to register
            check_run_method(Path(known.resume), saved_cfg)
        config_cls = method_class(known.method).Config
    except ValueError as err:
        raise UsageError(str(err)) from err
    parser = _train_parser(config_cls)
    if method_named and known.method != "dense":  # its options are in its own --help
        parser.help_command = f"pdtbench train --method {known.method}"
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # another method's option is named as such; anything else, argparse's error
        hint = _other_methods_options(unknown, known.method)
        if hint:
            raise UsageError(hint)
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    progress = not args.no_progress
    if args.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {args.nproc}")
    if args.dist_timeout is not None and not args.dist_timeout > 0:
        raise UsageError(f"--dist-timeout must be > 0 seconds, got {args.dist_timeout}")
    conflict = _conflicting_flags(args, known.method, distributed.env_world() is not None)
    if conflict:
        parser.error(conflict)
    given = _resume_changes(parser, args, argv, saved_cfg) if args.resume else []
    if given:  # refused before torchrun starts N workers that would each refuse it
        raise UsageError(
            f"--resume continues the run with its saved config; {', '.join(given)} cannot "
            "change it (start a new run with another --out to train differently)"
        )
    if args.resume:  # a finished run: its result, said to be one, with no process started
        done = _finished_run_to_resume(Path(args.resume))
        if done is not None:
            _print_result(Path(args.resume), done)
            return 0
    cfg = None
    if not args.resume:  # refused once, before torchrun starts N workers that would each
        check_scale_device(args.scale, args.device or "auto")
        cfg = _checked_config(args, parser)
        done = (
            None
            if cfg.out is not None
            else _same_finished_run(Path(cfg.default_out()), args.nproc, cfg.device, cfg.method)
        )
        if done is not None:  # the same command again: its result, not an error
            _print_result(Path(cfg.default_out()), done)
            return 0
    if args.nproc > 1 and distributed.env_world() is None:
        # what every worker would refuse, refused here once, before torchrun starts them
        device = cfg.device if cfg is not None else getattr(saved_cfg, "device", "auto")
        if str(device).startswith("cuda:"):
            raise UsageError(
                f"--device {device} with --nproc {args.nproc} would put every process on that "
                "one GPU; give --device cuda (each process takes the GPU of its local rank)"
            )
        from impl.train import pick_device

        try:  # no CUDA here: said as one process would say it
            pick_device(str(device))
        except ValueError as err:
            raise UsageError(str(err)) from err
        shortage = distributed.gpu_shortage(args.nproc, device)
        if shortage is not None:
            raise UsageError(f"--nproc {args.nproc}: {shortage}")
        check_before_workers(cfg, args.resume, args.data_dir)
        # torchrun runs it N times; Ctrl-C here stops the job (launch), then says how to go on
        run_dir = Path(args.resume) if args.resume else Path(cfg.out or cfg.default_out())
        how = f" --nproc {args.nproc}"
        if args.dist_timeout is not None:  # how it ran, kept by the command that continues it
            how += f" --dist-timeout {args.dist_timeout:g}"
        with _interrupt_hint(run_dir, how):
            return distributed.launch(["train", *argv], args.nproc)

    if args.resume:
        device = saved_cfg.device if saved_cfg is not None else "auto"  # resume() reports
        with _interrupt_hint(Path(args.resume)):
            summary = distributed.run_worker(
                lambda: resume(args.resume, progress=progress, data_dir=args.data_dir),
                device,
                args.dist_timeout,
            )
        _print_result(Path(args.resume), summary)
        return 0

    assert cfg is not None
    if cfg.out is None:
        cfg.out = cfg.default_out()
    with _interrupt_hint(Path(cfg.out)):
        summary = distributed.run_worker(
            lambda: train(cfg, progress=progress), cfg.device, args.dist_timeout
        )
    _print_result(Path(cfg.out), summary)
    return 0


def _finished_run_to_resume(run_dir: Path) -> dict[str, Any] | None:
    """The summary of the finished run ``--resume run_dir`` names, after one line saying so
    (resuming it trains nothing, and its result would read as if just trained); else None.
    Errors (not a run, diverged) are left to the resume itself, which reports them."""
    from impl.distributed import env_world
    from impl.train import finished_summary_to_resume

    try:
        summary = finished_summary_to_resume(run_dir)
    except Exception:  # reported by resume(), in its words
        return None
    if summary is not None:
        from impl.run_files import SUMMARY_FILE, summary_fields_wrong

        wrong = summary_fields_wrong(summary)
        if wrong:  # edited by hand: its result cannot be printed, nor trusted
            raise UsageError(
                f"{run_dir / SUMMARY_FILE} says the run finished, but {wrong}: remove it and "
                "--resume again, which writes it anew from the last checkpoint"
            )
    if summary is not None and (env_world() or (0,))[0] == 0:  # under torchrun: rank 0 only
        print(f"{run_dir} holds a finished run: its result (nothing trained)")
    return summary


def _same_finished_run(
    run_dir: Path, nproc: int, device: str, method: str = "dense"
) -> dict[str, Any] | None:
    """The summary of the finished run in ``run_dir``, the default ``--out`` of a config (its
    name holds the config's digest), where this code trained it the way asked now: the same
    command given again prints its result instead of refusing the directory. None where
    there is no finished run, or one of another commit or of a tree with changes, of another
    number of processes (``--nproc`` is not in the digest) or, with ``device`` "auto", of
    another kind of device than this machine picks (it is then refused as before: a finished
    run is never trained over).

    Raises:
        UsageError: the run is of a registered ``method`` whose class or source file has
            changed since (:func:`impl.methods.identity_change`; a plug-in outside the
            repository leaves the commit as it was): its result is not this code's.
    """
    from impl.env import collect
    from impl.methods import identity_change
    from impl.rundir import complete_summary
    from impl.train import pick_device

    summary = complete_summary(run_dir)
    if summary is None:
        return None
    then, now = summary.get("environment") or {}, collect()
    same = now.get("commit") and then.get("commit") == now.get("commit")
    if not same or then.get("dirty") or now.get("dirty"):
        return None
    if int(summary.get("world_size") or 1) != nproc:
        return None
    ran_on = str(summary.get("device") or "")
    if ran_on.split(":")[0] != pick_device(device).type:
        return None
    changed = identity_change(summary, method)
    if changed is not None:
        raise UsageError(
            f"{run_dir} holds this config's finished run, but {changed}: its result is not "
            f"this code's; remove {run_dir} to train it again, or give another --out"
        )
    print(f"{run_dir} already holds this config's finished run, trained by this commit: its "
          "result (--seed or --out trains another)")  # fmt: skip
    return summary


def _conflicting_flags(args: argparse.Namespace, method: str, under_torchrun: bool) -> str:
    """Why two of ``pdtbench train``'s flags given together would have one of them silently
    ignored, naming both; "" when none are. ``under_torchrun``: a worker started by torchrun
    (where ``--dist-timeout`` applies without ``--nproc``)."""
    if args.no_augment and args.augment_recipe is not None:
        return (
            "--augment-recipe chooses the augmentation that --no-augment turns off: give one "
            "of them"
        )
    if args.nesterov and args.momentum == 0:
        return (
            "--nesterov is a kind of momentum, and --momentum is 0 (none): give a momentum "
            "> 0, or leave --nesterov out"
        )
    if args.dist_timeout is not None and args.nproc == 1 and not under_torchrun:
        return (
            "--dist-timeout is the timeout of a distributed run's collectives, and --nproc is 1 "
            "(one process, none to time out): give --nproc N (N > 1), or run under torchrun"
        )
    # A resumed run's options are its saved ones (a flag may only repeat them, which
    # _resume_changes checks against the run itself, not against the method's defaults).
    owners = {} if args.resume else OPTION_OWNERS
    for (owner_method, name), (owner, acting) in owners.items():
        if owner_method != method or getattr(args, f"method__{name}", None) is None:
            continue
        value = getattr(args, f"method__{owner}", None)
        if value is None:  # the owner's default
            from impl.methods import method_class

            value = getattr(method_class(method).Config(), owner)
        if value not in acting:
            wanted = " or ".join(_flag_value(owner, v) for v in acting)
            return (
                f"{_flag(name)} is a setting of {wanted}, and {_flag(owner)} is "
                f"{flag_text(value)}: give {wanted}, or leave {_flag(name)} out"
            )
    return ""


#: A method option that acts only where another option of the method takes one of some
#: values: ``(method, option) -> (that option, its values where this one acts)``. Given with
#: the other option elsewhere, the option would be recorded in the run and do nothing.
OPTION_OWNERS: dict[tuple[str, str], tuple[str, tuple[Any, ...]]] = {
    # the rescale rule and its constant act on rescaled magnitude only
    ("sdgp", "rescale"): ("prune_method", ("rescaled",)),
    ("sdgp", "rescale_eps"): ("prune_method", ("rescaled",)),
    # window pruning's share of the target is a part of the combined mask
    ("campfire", "window_fraction"): ("mask", ("combined",)),
    ("campfire", "window_rounding"): ("mask", ("window", "combined")),
    ("campfire", "window_max_nonzero"): ("mask", ("window", "combined")),
    # block FC pruning prunes the linear layers prune_fc names
    ("campfire", "fc_block"): ("prune_fc", (True,)),
    ("campfire", "fc_block_fraction"): ("prune_fc", (True,)),
    # the dynamic mini-batch's growth
    ("prunetrain", "batch_step"): ("dynamic_batch", (True,)),
    ("prunetrain", "max_batch"): ("dynamic_batch", (True,)),
}


def _flag_value(name: str, value: Any) -> str:
    return f"{_flag(name)} {flag_text(value)}"


# What --resume may be given with: how to run, not what to train.
_RESUME_FLAGS = ("resume", "no_progress", "nproc", "dist_timeout", "data_dir")


def _resume_changes(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str], saved: Any
) -> list[str]:
    """The flags typed in ``argv`` with ``--resume`` that would change the saved run: all
    but :data:`_RESUME_FLAGS` whose value differs from the saved config ``saved`` (a
    :class:`impl.config.TrainConfig`; with ``None``, every such flag). A flag that repeats
    the saved value (``--out`` the resumed directory, ``--epochs`` as saved) changes nothing."""
    typed = {t.split("=", 1)[0] for t in argv if t.startswith("--")}
    changes = []
    for action in parser._actions:
        if action.dest in _RESUME_FLAGS or not typed.intersection(action.option_strings):
            continue
        value = getattr(args, action.dest)
        if saved is None or not _is_saved_value(action.dest, value, saved, args.resume):
            changes.append(action.option_strings[0])
    return changes


def _is_saved_value(dest: str, value: Any, saved: Any, run_dir: str) -> bool:
    """Whether the flag ``dest`` set to ``value`` repeats what the saved config holds."""
    if dest == "out":
        return Path(value).resolve() == Path(run_dir).resolve()
    if dest.startswith("method__"):
        name = dest.removeprefix("method__")
        if name in saved.method_options:
            return saved.method_options[name] == value
        from impl.config import is_default_option

        return is_default_option(saved.method, name, value)  # a run saves none at its default
    if dest == "image_size":
        return (saved.data_options or {}).get("image_size") == value
    if dest == "max_steps_per_epoch" and value == EVERY_BATCH:
        return saved.max_steps_per_epoch is None
    if dest == "no_augment":
        return saved.augment is not value
    if dest == "no_bn_weight_decay":
        return saved.bn_weight_decay is not value
    if dest == "device" and value != saved.device:
        from impl.train import pick_device

        try:  # "cpu" for a run saved with "auto" on a machine without a GPU
            return pick_device(value) == pick_device(saved.device)
        except (RuntimeError, ValueError):
            return False
    return dest in saved.__dataclass_fields__ and getattr(saved, dest) == value


class Interrupted(Exception):
    """Training was stopped by Ctrl-C or SIGTERM; the message says what was kept and how to
    go on, ``code`` the exit status that says which signal."""

    def __init__(self, message: str, code: int = EXIT_INTERRUPTED) -> None:
        super().__init__(message)
        self.code = code


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a batch scheduler's time limit, ``docker stop``), raised where
    Ctrl-C raises :class:`KeyboardInterrupt`, so that it stops the work the same way: what
    finished is kept, the rest is cleaned up, and the command says how to go on."""

    #: the status a shell reports for a process stopped by SIGTERM
    exit_code = EXIT_TERMINATED


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _exit_code(err: BaseException) -> int:
    return int(getattr(err, "exit_code", EXIT_INTERRUPTED))


#: What a command stopped by Ctrl-C outside its own handling keeps (training says it itself once
#: the run began).
_RUNS_KEPT = "; what finished is kept (runs, results): the same command continues from there"
_INTERRUPTED_KEPT = {
    "reproduce": _RUNS_KEPT,
    "demo": _RUNS_KEPT,
    "train": " before the run began; nothing was written",
}


@contextlib.contextmanager
def _interrupt_hint(run_dir: Path, flags: str = ""):
    """Turn Ctrl-C (or SIGTERM) during training into :class:`Interrupted` naming the resume
    command (with ``flags`` appended: how the run was launched)."""
    try:
        yield
    except KeyboardInterrupt as stop:
        from impl.rundir import CONFIG_FILE, load_checkpoint

        if not (run_dir / CONFIG_FILE).exists():
            raise Interrupted(
                "interrupted before the run began; nothing was written", _exit_code(stop)
            ) from None
        try:  # what resume keeps: the checkpoint's epochs (an epoch's metrics line is written
            # before its checkpoint, so counting lines could claim one epoch too many)
            state = load_checkpoint(run_dir)
            done = int(state.get("epoch", 0)) if state else 0
        except Exception:  # noqa: BLE001 - an unreadable checkpoint: nothing to resume from
            done = 0
        kept = f"{done} finished epoch(s) are saved" if done else "no epoch had finished"
        raise Interrupted(
            f"interrupted; {kept}: continue with `pdtbench train --resume {run_dir}{flags}`",
            _exit_code(stop),
        ) from None


def _print_result(run_dir: Path, summary: dict[str, Any]) -> None:
    from impl.distributed import env_world

    if (env_world() or (0,))[0] != 0:
        return  # under torchrun only rank 0 reports

    from impl.run_files import holds_type

    def num(key: str, fmt: str, default: float | None = None) -> str:  # "?" where not a number
        value = summary.get(key, default)
        return format(value, fmt) if holds_type(value, (int, float)) else "?"

    print(
        f"{summary.get('method')} {summary.get('model')} on {summary.get('data')} "
        f"[{summary.get('scale')}]: top-1 {num('top1', '.2f')}%, compression "
        f"{num('compression_ratio', '.2f', 1.0)}x, "
        f"fwd {num('fwd_ms', '.1f')} ms, "
        f"bwd {num('bwd_ms', '.1f')} ms per iteration (last epoch's "
        "medians), "
        f"{num('wall_seconds', '.1f')} s"
    )
    print(f"results: {run_dir}/summary.json (metrics.jsonl, config.json, checkpoint.pt)")
    note = _result_note(summary)
    if note:
        print(f"note: {note}")


def _result_note(summary: dict[str, Any]) -> str | None:
    """What a reader of the result line should not miss: synthetic data's top-1 means
    nothing; a batch larger than the training set made each epoch one smaller step; a top-1
    within twice chance means the run was too short to learn."""
    if summary.get("data_synthetic"):
        return "synthetic data (random labels): the top-1 is meaningless; use it for timing only"
    spec = summary.get("data_spec") or {}
    batch, train_size = summary.get("batch_size"), spec.get("train_size")
    if batch and train_size and batch > train_size:
        return (
            f"--batch-size {batch} is larger than the {train_size} training samples of "
            f"{spec.get('name', 'the data')}: each epoch was one step of {train_size}, and the "
            f"config still says {batch}"
        )
    classes = spec.get("num_classes")
    top1 = summary.get("top1")
    if not classes or top1 is None:
        return None
    from impl.config import SCALE_PRESETS

    chance = 100.0 / classes
    if top1 >= 2 * chance:
        return None
    text = (
        f"top-1 {top1:.2f}% is within twice chance ({chance:.1f}% for {classes} classes): "
        f"{summary.get('epochs')} epoch(s) were too few steps to learn"
    )
    if summary.get("scale") == "smoke":  # a few steps an epoch: more epochs do not learn
        return (
            f"{text}; --scale smoke checks that the pipeline runs (a few steps an epoch) and "
            "is not meant to learn: --scale cpu trains to accuracy on the CPU"
        )
    preset = SCALE_PRESETS.get(str(summary.get("scale")), {}).get("epochs")
    if preset and preset > (summary.get("epochs") or 0):
        text += f"; --scale {summary.get('scale')} trains {preset} epochs unless --epochs is given"
    return text


# -- env -------------------------------------------------------------------------------------------
def cmd_env(argv: list[str]) -> int:
    """``pdtbench env``: print what this machine is (versions, CPU, GPU, clocks) and which
    N:M pruning and pattern conv run on CPU tensors (``nm_prune_cpu``, ``pattern_conv_cpu``:
    the compiled kernel or the reference, with the reason)."""
    import json

    from impl.env import collect, format_env
    from impl.ops import nm_cpu, pattern_cpu

    p = OneLineParser(prog="pdtbench env", description="Describe this machine.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    info = collect()
    # Which N:M pruning and pattern conv run on CPU tensors by default (builds the compiled
    # kernels where they can).
    for key, module in (("nm_prune_cpu", nm_cpu), ("pattern_conv_cpu", pattern_cpu)):
        why = module.unavailable_reason()
        source = f"impl/cpu/{module.SOURCE.name}"
        info[key] = f"compiled kernel ({source})" if why is None else f"torch reference: {why}"
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(format_env(info))
    print(ENV_FLAGS_NOTE)
    return 0


#: Below ``pdtbench env``'s table: its TF32 and cuDNN rows are torch's defaults, not a run's.
ENV_FLAGS_NOTE = (
    "(tf32_matmul, tf32_cudnn, cudnn_benchmark: torch's settings in this process; "
    "`pdtbench train` sets all three from --tf32 and --cudnn-benchmark, off unless given, "
    "and each run records its own)"
)


# -- eval-fgsm -------------------------------------------------------------------------------------
def cmd_eval_fgsm(argv: list[str]) -> int:
    """``pdtbench eval-fgsm RUN_DIR --eps ...``: top-1 under FGSM (Campfire Table 6)."""
    from impl.robustness import check_attackable, eval_fgsm_run
    from impl.train import pick_device

    p = OneLineParser(
        prog="pdtbench eval-fgsm",
        description="Top-1 of finished runs' models on FGSM adversarial examples of their "
        "test sets, each model attacking itself (Campfire Sec. 3.2, Table 6); the rows are "
        "also written to <RUN_DIR>/fgsm.json, beside an earlier call's rows at other eps.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finished run directories")
    p.add_argument(
        "--eps",
        type=float,
        nargs="+",
        default=[0.0, 0.05, 0.1],
        help="perturbations per pixel, on the [0, 1] scale of the raw images (default: 0 0.05 0.1)",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (CUDA when present)")
    p.add_argument(
        "--data-dir",
        type=directory,
        help="where the runs' dataset is now, if it moved since training (default: the run's)",
    )
    args = p.parse_args(argv)
    # a run named twice (a repeated glob, "run" and "./run/") is attacked once
    named: dict[str, str] = {}
    for run_dir in args.run_dirs:
        named.setdefault(os.path.realpath(run_dir), run_dir)
    # every one, before the first attack; their summaries, read once
    summaries = {run_dir: check_attackable(run_dir) for run_dir in named.values()}
    device = str(pick_device(args.device))
    for run_dir, summary in summaries.items():
        rows = eval_fgsm_run(run_dir, args.eps, device=device, data_dir=args.data_dir)
        for row in rows:
            print(f"{run_dir}: eps {row['eps']:g}: top-1 {row['top1']:.2f}%")
        if (summary or {}).get("data_synthetic"):
            print(
                f"note: {run_dir} trained on synthetic data (random labels): its top-1 under "
                "attack is as meaningless as its top-1",
                file=sys.stderr,
            )
    return 0


# -- demo ------------------------------------------------------------------------------------------
def cmd_demo(argv: list[str]) -> int:
    """``pdtbench demo``: the main job, the CPU-scale reproduction on the embedded data."""
    from reproductions import demo, report_failures
    from reproductions.parallel import add_jobs_argument

    p = OneLineParser(
        prog="pdtbench demo",
        description="Every table and figure of the four papers and the cross-method table at "
        "the given scale (the five built-in methods and any registered one, on digits), then "
        "the HTML report.",
    )
    p.add_argument(
        "--scale",
        default="cpu",
        choices=["smoke", "cpu"],
        help="smoke: seconds, for tests; cpu: digits and small models, minutes on 2 cores "
        "(default: cpu)",
    )
    p.add_argument("--out", default="reports", type=directory,
                   help="where the HTML report goes (default: reports)")  # fmt: skip
    p.add_argument(
        "--runs-root",
        "--runs",
        dest="runs",
        default="runs/reproductions",
        type=directory,
        help="where the runs go, as reproduce's --runs-root (default: runs/reproductions)",
    )
    add_jobs_argument(p, gpu_scales=False)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    failed: list[str] = []
    demo(
        scale=args.scale,
        out=args.out,
        runs_root=args.runs,
        jobs=args.jobs,
        failed=failed,
        progress=not args.no_progress,
        threads=args.threads,
    )
    return report_failures(failed)


# -- reproduce / report ----------------------------------------------------------------------------
def cmd_reproduce(argv: list[str]) -> int:
    """``pdtbench reproduce <paper>.<item>|all --scale S``: regenerate tables and figures."""
    from reproductions import main as reproduce_main

    return reproduce_main(argv)


def cmd_report(argv: list[str]) -> int:
    """``pdtbench report PATHS... --out DIR``: render saved results into HTML."""
    from impl.report import main as report_main

    return report_main(argv)


COMMANDS = {
    "reproduce": cmd_reproduce,
    "report": cmd_report,
    "train": cmd_train,
    "env": cmd_env,
    "demo": cmd_demo,
    "eval-fgsm": cmd_eval_fgsm,
}


def _version() -> str:
    """The installed distribution's version, or pyproject's where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("pdtbench")
    except metadata.PackageNotFoundError:
        import tomllib

        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
        return str(tomllib.loads(text)["project"]["version"])


def stdout_reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (``pdtbench ... | head``
    after ``head`` exits). ``False`` where it cannot tell (no ``poll``, no file descriptor)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pdtbench`` console script: runs the command, and stops quietly
    with :data:`EXIT_BROKEN_PIPE` once the reader of its output has left
    (``pdtbench reproduce --list | head``), standard output then on /dev/null so that the
    interpreter's last flush is silent. Ctrl-C before the command's own handling begins
    (while its first imports load) stops it as quietly, with :data:`EXIT_INTERRUPTED`."""
    try:
        return _main(argv)
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as stop:  # nothing has been done yet: nothing to say but that
        words = list(sys.argv[1:2] if argv is None else argv[:1])
        name = f"pdtbench {words[0]}" if words and words[0] in COMMANDS else "pdtbench"
        print(f"{name}: interrupted", file=sys.stderr)
        return _exit_code(stop)


#: Set to 1, a command that ends in a one-line error prints the traceback before it.
TRACEBACK_VARIABLE = "PDTBENCH_TRACEBACK"
#: The project's packages: an error raised in their code is a message written for the user.
_PROJECT_DIRS = tuple(
    Path(__file__).resolve().parents[1] / d for d in ("impl", "reproductions", "bench")
)


def _raised_outside(err: BaseException) -> str:
    """Where ``err`` was raised, when that is not the project's own code (torch's, say): such
    an error is less likely a message about the user's input than a failure inside the work,
    and the one line should say where it came from. Empty for the project's own errors and
    for what is not a ValueError (an OSError names its path, an ImportError its package)."""
    if not isinstance(err, ValueError):
        return ""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    last = Path(frames[-1].filename).resolve()
    if any(last.is_relative_to(d) for d in _PROJECT_DIRS):
        return ""
    return (
        f" (raised in {last.name}:{frames[-1].lineno} {frames[-1].name}, outside pdtbench;"
        f" {TRACEBACK_VARIABLE}=1 prints the traceback)"
    )


def _raised_by_loaded(*names: tuple[str, str]) -> tuple[type[BaseException], ...]:
    """The exception classes ``(module, class name)`` of the modules already imported.

    An ``except`` clause evaluates its classes when an exception reaches it, and an error
    of a module never imported cannot have been raised: so :func:`_main` catches the
    training modules' errors without importing them (and torch) for commands that never
    load them (``pdtbench report``).
    """
    found = []
    for module, name in names:
        # A module stopped halfway through its import (Ctrl-C) may lack the class yet.
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--version":
        print(f"pdtbench {_version()}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: pdtbench {" + ",".join(COMMANDS) + "} ... | --version")
        print("  train       train one model with one method (--resume DIR continues a run)")
        print("  demo        the main job on the embedded default data")
        print("  env         describe this machine")
        print("  eval-fgsm   top-1 under FGSM attacks for finished runs")
        print("  reproduce   regenerate a paper's tables and figures (or all) at a scale")
        print("  report      render saved results into self-contained HTML")
        return 0 if argv else EXIT_USAGE
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(
            f"pdtbench: error: unknown command {command!r}; valid: {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    on_main_thread = threading.current_thread() is threading.main_thread()  # signals reach it
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if on_main_thread else None
    try:
        return COMMANDS[command](rest)
    except (
        UsageError,
        ValueError,
        OSError,
        ImportError,
        *_raised_by_loaded(
            ("impl.rundir", "RunBusyError"),
            ("impl.rundir", "CheckpointError"),
        ),
    ) as err:
        # OSError: an output path that cannot be made or written (not a directory, no
        # permission, disk full), or one that holds a run already (impl.train's
        # RunExistsError, a FileExistsError); the message names the path. A broken pipe is one too,
        # unless it is our output's reader that left: main then stops quietly. ImportError:
        # an optional package a command needs (torchvision for ImageNet), named with how to
        # install it.
        if isinstance(err, BrokenPipeError) and stdout_reader_gone():
            raise
        if os.environ.get(TRACEBACK_VARIABLE) == "1":
            traceback.print_exception(err)
        print(f"pdtbench {command}: error: {err}{_raised_outside(err)}", file=sys.stderr)
        return EXIT_USAGE
    except _raised_by_loaded(("impl.train", "TrainingDiverged")) as err:
        print(f"pdtbench {command}: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except Interrupted as err:
        print(f"pdtbench {command}: {err}", file=sys.stderr)
        return err.code
    except KeyboardInterrupt as stop:
        print(f"pdtbench {command}: interrupted{_INTERRUPTED_KEPT.get(command, '')}",
              file=sys.stderr)  # fmt: skip
        return _exit_code(stop)
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
