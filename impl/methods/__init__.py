"""Registry of methods. Modules are imported lazily, by name, when a method is asked for."""

from __future__ import annotations

import dataclasses
import importlib

from impl.methods.base import Method, MethodConfig, TrainContext

# name -> "module:ClassName"
_REGISTRY: dict[str, str] = {
    "dense": "impl.methods.dense:Dense",
    "clicktrain": "impl.methods.clicktrain:ClickTrain",
    "prunetrain": "impl.methods.prunetrain:PruneTrain",
    "sdgp": "impl.methods.sdgp:SDGP",
    "campfire": "impl.methods.campfire:Campfire",
}

METHODS: tuple[str, ...] = tuple(_REGISTRY)


def method_class(name: str) -> type[Method]:
    """Return the :class:`Method` subclass registered under ``name``.

    Raises ``ValueError`` naming the valid methods for an unknown name.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown method {name!r}; valid methods: {', '.join(METHODS)}")
    module_name, class_name = _REGISTRY[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name:
            raise ValueError(f"method {name!r} is not available in this build") from err
        raise
    return getattr(module, class_name)


def create_method(name: str, options: dict | None = None) -> Method:
    """Build method ``name`` with its config fields set from ``options`` (plain data)."""
    cls = method_class(name)
    options = dict(options or {})
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for method {name!r}; valid: {sorted(fields) or 'none'}"
        )
    return cls(cls.Config(**options))


__all__ = ["METHODS", "Method", "MethodConfig", "TrainContext", "create_method", "method_class"]
