"""Registry of methods. Modules are imported lazily, by name, when a method is asked for.

The five built-in methods are always there. A method of your own (a subclass of
:class:`impl.methods.base.Method` with a ``Config`` dataclass) joins them in one of three ways
(``docs/new-method.md``):

* an entry point of an installed package, group ``pdtbench.methods``
  (``gmp = "mypkg.gmp:GradualMagnitude"`` under ``[project.entry-points."pdtbench.methods"]``);
* the environment variable ``PDTBENCH_METHODS="gmp=mypkg.gmp:GradualMagnitude,..."``;
* :func:`register_method` in the running process.

The first two reach worker processes too (``--nproc``, the parallel jobs of ``pdtbench
reproduce``, a resumed run): a method registered by :func:`register_method` lives only in the
process that registered it.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
from importlib import metadata
from typing import Any

from impl.cli_parser import did_you_mean
from impl.config import check_field_types
from impl.methods.base import Method, MethodConfig, TrainContext

# the built-in methods: name -> "module:ClassName"
_REGISTRY: dict[str, str] = {
    "dense": "impl.methods.dense:Dense",
    "clicktrain": "impl.methods.clicktrain:ClickTrain",
    "prunetrain": "impl.methods.prunetrain:PruneTrain",
    "sdgp": "impl.methods.sdgp:SDGP",
    "campfire": "impl.methods.campfire:Campfire",
}

METHODS: tuple[str, ...] = tuple(_REGISTRY)
"""The built-in methods (:func:`available_methods` adds the registered ones)."""

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "pdtbench.methods"
ENV_VAR = "PDTBENCH_METHODS"
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*\Z")
_REGISTERED: dict[str, str | type[Method]] = {}
_WARNED: set[tuple[str, str]] = set()


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"a method name is lower case letters, digits and '_', starting with a letter; "
            f"got {name!r}"
        )


def _check_target(name: str, target: object) -> None:
    if isinstance(target, str):
        if not _TARGET.match(target):
            raise ValueError(
                f"method {name!r}: expected 'package.module:ClassName', got {target!r}"
            )
        return
    if not (isinstance(target, type) and issubclass(target, Method)):
        raise TypeError(f"method {name!r}: {target!r} is not a subclass of impl.methods.Method")
    config = target.Config
    if not (dataclasses.is_dataclass(config) and issubclass(config, MethodConfig)):
        raise TypeError(
            f"method {name!r}: {target.__name__}.Config must be a dataclass subclassing "
            "MethodConfig"
        )


def register_method(name: str, target: str | type[Method], *, replace: bool = False) -> None:
    """Make ``target`` (a :class:`Method` subclass, or ``"package.module:ClassName"``,
    imported when first used) trainable as method ``name`` in this process.

    Raises ``ValueError`` for a malformed name or target, for a built-in name, and for a name
    already registered unless ``replace``; ``TypeError`` for a class that is not a
    :class:`Method` with a ``Config`` dataclass subclassing :class:`MethodConfig`.
    """
    _check_name(name)
    _check_target(name, target)
    if name in _REGISTRY:
        raise ValueError(f"{name!r} is a built-in method; choose another name")
    if name in _registered() and not replace:
        raise ValueError(f"method {name!r} is already registered (pass replace=True)")
    _REGISTERED[name] = target


def unregister_method(name: str) -> None:
    """Forget a method :func:`register_method` added (``KeyError`` if it did not)."""
    del _REGISTERED[name]


def _from_environment() -> dict[str, str]:
    out: dict[str, str] = {}
    text = os.environ.get(ENV_VAR, "").strip()
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, target = item.partition("=")
        name, target = name.strip(), target.strip()
        if not sep:
            raise ValueError(f"{ENV_VAR}: expected name=package.module:ClassName, got {item!r}")
        _check_name(name)
        _check_target(name, target)
        if name in _REGISTRY:
            raise ValueError(
                f"{ENV_VAR}: {name!r} is a built-in method and cannot be replaced; "
                "register yours under another name"
            )
        if name in out and out[name] != target:  # which one was meant cannot be told
            raise ValueError(
                f"{ENV_VAR}: {name!r} is given twice ({out[name]} and {target}); give each "
                "name once"
            )
        out[name] = target
    return out


def method_source_digest(cls: type) -> str | None:
    """SHA-256 (16 hex digits) of the source file that defines ``cls``; None when it has no
    readable file. A run's summary records it, so a run of a method whose code has changed
    since is not mistaken for a run of the current code."""
    import hashlib
    import inspect

    try:
        path = inspect.getsourcefile(cls)
        if path is None:
            return None
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except (OSError, TypeError):
        return None


def method_identity(cls: type) -> dict[str, str | None]:
    """Which code a method name ran: ``{"method_class": "module:Qualname",
    "method_source_sha256": ...}`` (:func:`method_source_digest`). A run's summary and each
    of its checkpoints record it."""
    return {
        "method_class": f"{cls.__module__}:{cls.__qualname__}",
        "method_source_sha256": method_source_digest(cls),
    }


def identity_change(recorded: dict, name: str) -> str | None:
    """Why a run that recorded ``recorded`` (:func:`method_identity`'s keys) for the
    registered method ``name`` cannot stand for, or be continued by, the method as it is now:
    another class is registered under the name, or its class's source file has changed. None
    when it can, for a built-in method (its runs are the project's own, versioned by the
    commit each records) and for a method that cannot be imported here (its own error says
    so). A record without the keys stands for unknown code: it cannot."""
    if is_builtin(name):
        return None
    try:
        now = method_identity(method_class(name))
    except ValueError:
        return None
    if recorded.get("method_class") != now["method_class"]:
        return (
            f"it was trained by {recorded.get('method_class')}; "
            f"{name!r} is now {now['method_class']}"
        )
    if recorded.get("method_source_sha256") != now["method_source_sha256"]:
        return f"the source of {now['method_class']} has changed since it was trained"
    return None


def is_builtin(name: str) -> bool:
    """Whether ``name`` is one of the built-in methods (never a registered one)."""
    return name in _REGISTRY


def _from_entry_points() -> dict[str, str]:
    """``{name: "module:attr"}`` of the installed packages' entry points; one that is malformed
    is logged and left out (another package's mistake must not stop this one)."""
    out: dict[str, str] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        target = f"{ep.module}:{ep.attr}" if ep.attr else ep.value
        try:
            _check_name(ep.name)
            _check_target(ep.name, target)
        except ValueError as err:
            if (ep.name, ep.value) not in _WARNED:  # once per process, not per lookup
                _WARNED.add((ep.name, ep.value))
                log.warning("ignoring entry point %s = %r: %s", ep.name, ep.value, err)
            continue
        out[ep.name] = target
    return out


def _registered() -> dict[str, str | type[Method]]:
    """Entry points, then the environment variable, then :func:`register_method` (a later
    source wins for the same name); built-in names are never shadowed."""
    out: dict[str, str | type[Method]] = {}
    out.update(_from_entry_points())
    out.update(_from_environment())
    out.update(_REGISTERED)
    return {k: v for k, v in out.items() if k not in _REGISTRY}


def available_methods() -> tuple[str, ...]:
    """Every method name that can be trained here: the built-ins first, then the registered
    ones in name order."""
    return METHODS + tuple(sorted(_registered()))


def method_class(name: str) -> type[Method]:
    """Return the :class:`Method` subclass registered under ``name``.

    Raises ``ValueError`` naming the valid methods for an unknown name, for a registered
    target that cannot be imported or is not a :class:`Method`, and for a malformed
    ``PDTBENCH_METHODS`` or one that names a built-in method (for a built-in name too).
    """
    target = _REGISTRY.get(name)
    if target is None:
        target = _registered().get(name)
    else:  # a mistake in the variable is an error whatever method is trained: not ignored
        _from_environment()
    if target is None:
        valid = available_methods()
        raise ValueError(
            f"unknown method {name!r}{did_you_mean(name, valid)}; valid methods: {', '.join(valid)}"
        )
    if not isinstance(target, str):
        return target
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if name not in _REGISTRY:
            raise ValueError(f"method {name!r}: cannot import {module_name!r} ({err})") from err
        if err.name == module_name:
            raise ValueError(f"method {name!r} is not available in this build") from err
        raise
    cls: Any = module
    for part in class_name.split("."):  # "Outer.Inner" names a nested class
        cls = getattr(cls, part, None)
    if cls is None:
        raise ValueError(f"method {name!r}: module {module_name!r} has no {class_name!r}")
    try:
        _check_target(name, cls)
    except TypeError as err:
        raise ValueError(str(err)) from err
    return cls


def create_method(name: str, options: dict | None = None) -> Method:
    """Build method ``name`` with its config fields set from ``options`` (plain data);
    ``ValueError`` for an unknown option or a value not of its field's type
    (:func:`impl.config.check_field_types`)."""
    cls = method_class(name)
    options = dict(options or {})
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for method {name!r}; valid: {sorted(fields) or 'none'}"
        )
    try:  # before the config's own checks, which compare the values
        check_field_types(cls.Config, options)
    except ValueError as err:
        raise ValueError(f"method {name!r}: option {err}") from None
    return cls(cls.Config(**options))


__all__ = [
    "ENTRY_POINT_GROUP",
    "is_builtin",
    "identity_change",
    "method_identity",
    "method_source_digest",
    "ENV_VAR",
    "METHODS",
    "Method",
    "MethodConfig",
    "TrainContext",
    "available_methods",
    "create_method",
    "method_class",
    "register_method",
    "unregister_method",
]
