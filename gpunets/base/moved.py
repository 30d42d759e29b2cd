"""Old module paths as aliases of where the modules live now (files saved before the move, deep imports).

gpunets' modules moved into packages by layer (``gpunets.plan`` is now :mod:`gpunets.planning.plan`).
A pickle or skops file names classes and functions by module path, and so may code that imported a
module deeply: this finder makes each old path an alias of its module (the same module object, so
classes compare equal).  Nothing is imported until an old path is asked for.

>>> import importlib
>>> importlib.import_module("gpunets.plan") is importlib.import_module("gpunets.planning.plan")
True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
from typing import Any

__all__ = ["MOVED", "install"]

#: old module (under gpunets.) -> its module now
MOVED: dict[str, str] = {
    "exceptions": "base.exceptions", "config": "base.config", "verbs": "base.verbs", "saved": "base.saved",
    "_warn": "base._warn", "trace": "base.trace",
    "data": "devices.data", "value_types": "devices.value_types", "rows": "devices.rows",
    "gpu_memory": "devices.gpu_memory", "_gpulibs": "devices._gpulibs", "fakegpu": "devices.fakegpu",
    "fingerprint": "devices.fingerprint", "cache": "devices.cache",
    "models": "compute.models", "estimators": "compute.estimators", "threadsafety": "compute.threadsafety",
    "nodes": "core.nodes", "graph": "core.graph", "machines": "core.machines",
    "fitted_machine": "core.fitted_machine", "weights": "core.weights", "ops": "core.ops",
    "plan": "planning.plan", "scheduler": "executors.scheduler",
    "network": "api.network", "report": "api.report", "display": "api.display", "replace": "api.replace",
    "composite": "compose.composite", "_composite_extras": "compose._composite_extras",
    "_composite_ops": "compose._composite_ops", "routing": "compose.routing", "stacking": "compose.stacking",
    "persist": "persistence.persist", "_persist_codec": "persistence._persist_codec",
}
# ("devices" stays a name: the package gpunets.devices re-exports what the old module gpunets.devices had)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self._specs: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith("gpunets."):
            return None
        new = MOVED.get(fullname[len("gpunets."):])
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=f"alias of gpunets.{new}")

    def create_module(self, spec: Any) -> Any:
        module = importlib.import_module("gpunets." + MOVED[spec.name[len("gpunets."):]])
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: Any) -> None:
        # importlib has just set the module's __spec__ to the alias's: give it its own back
        for old, own in list(self._specs.items()):
            if own.name == module.__name__:
                module.__spec__ = own
                del self._specs[old]


class _Package(types.ModuleType):
    """The ``gpunets`` package, whose API names outlive the import of an old module path of the same name.

    Importing ``gpunets.report`` (an old path, as a saved file may) makes Python set the package's attribute
    ``report`` to that module, over ``gn.report`` the function; as before the move, the API name stays.
    """

    def __reduce__(self) -> Any:   # pickled (cloudpickle, Dask) as the module it is: by name
        return importlib.import_module, (self.__name__,)

    def __setattr__(self, name: str, value: Any) -> None:
        if (name in MOVED and isinstance(value, types.ModuleType)
                and not isinstance(self.__dict__.get(name, value), types.ModuleType)):
            return
        super().__setattr__(name, value)


def install(package: Any = None) -> None:
    """Put the alias finder on ``sys.meta_path`` (once; ``import gpunets`` does it) and keep the API names
    of ``package`` (the ``gpunets`` module) when an old path of the same name is imported."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
    if package is not None and type(package) is types.ModuleType:
        package.__class__ = _Package
