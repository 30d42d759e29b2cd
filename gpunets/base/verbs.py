"""The one seam from the lower layers up to the API layer.

Imports in gpunets point down (see ``docs/architecture.md``): the graph layer
(``nodes.py``, ``machines.py``) and the base layer (``config.py``) never import
the modules above them.  A few conveniences still need an upper layer:
``node()`` and ``node.fit()`` run :func:`gpunets.fit` / :func:`gpunets.evaluate`,
``node.to_dot()`` draws with :mod:`gpunets.api.display`, and ``gn.config(executor=...,
device=...)`` checks its values with the executors and devices modules.  They
reach those implementations here, by name, and nowhere else:

>>> from gpunets.base import verbs
>>> verbs.get("fit").__module__
'gpunets.api.network'
>>> sorted(verbs.PROVIDERS)[:3]
['all_sources', 'apply_gpu_memory', 'check_device']

Each verb is resolved on first use from the module that provides it (importing
it then, so ``display.py`` and its Graphviz stay lazy) and cached.
:func:`provide` installs another implementation, e.g. in a test.  This module
imports nothing from gpunets, so every layer may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["PROVIDERS", "get", "provide"]

#: verb -> "module:attribute" of the implementation in an upper layer.
PROVIDERS: dict[str, str] = {
    "fit": "gpunets.api.network:fit",                           # node.fit(), mach.fit()
    "evaluate": "gpunets.api.network:evaluate",                 # node(...)
    "to_dot": "gpunets.api.display:to_dot",                     # node.to_dot()
    "repr_svg": "gpunets.api.display:repr_svg",                 # node._repr_svg_()
    "repr_html": "gpunets.api.display:repr_html",               # mach._repr_html_(), composites
    "mimebundle": "gpunets.api.display:mimebundle",             # node._repr_mimebundle_()
    "reject_fit_data": "gpunets.api.network:reject_fit_data",   # node.fit(X) / mach.fit(X): says where data goes
    "check_executor": "gpunets.executors:check_executor_spec",   # gn.config(executor=...)
    "check_device": "gpunets.devices.placement:Device.parse",              # gn.config(device=...)
    "check_gpu_memory": "gpunets.devices.gpu_memory:check_gpu_memory",   # gn.set_config(gpu_memory=...)
    "check_thread_unsafe": "gpunets.compute.threadsafety:check_thread_unsafe_setting",   # gn.config(thread_unsafe=...)
    "apply_gpu_memory": "gpunets.devices.gpu_memory:apply_gpu_memory",
    "check_store": "gpunets.devices.store:check_store_setting",   # gn.config(store=...)
    # node.origins(), node.sources(), node.machines(): graph.py builds on the classes of nodes.py
    "origins": "gpunets.core.graph:origins",
    "all_sources": "gpunets.core.graph:all_sources",
    "upstream_machines": "gpunets.core.graph:upstream_machines",
}

_IMPL: dict[str, Callable[..., Any]] = {}


def provide(**impls: Callable[..., Any]) -> None:
    """Install implementations of verbs (``provide(fit=my_fit)``); they replace the default ones.

    >>> provide(no_such_verb=print)
    Traceback (most recent call last):
    ...
    TypeError: Unknown gpunets verb(s) ['no_such_verb']; ...
    """
    unknown = sorted(set(impls) - set(PROVIDERS))
    if unknown:
        msg = f"Unknown gpunets verb(s) {unknown}; the verbs are {sorted(PROVIDERS)}."
        raise TypeError(msg)
    _IMPL.update(impls)


def get(name: str) -> Callable[..., Any]:
    """The implementation of verb ``name``, importing its module on first use."""
    try:
        return _IMPL[name]
    except KeyError:
        pass
    module, _, attr = PROVIDERS[name].partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    _IMPL[name] = obj
    return obj
