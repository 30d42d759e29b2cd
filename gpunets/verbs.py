"""The one seam from the lower layers up to the API layer.

Imports in gpunets point down (see ``docs/architecture.md``): the graph layer
(``nodes.py``, ``machines.py``) and the base layer (``config.py``) never import
the modules above them.  A few conveniences still need an upper layer:
``node()`` and ``node.fit()`` run :func:`gpunets.fit` / :func:`gpunets.evaluate`,
``node.to_dot()`` draws with :mod:`gpunets.display`, and ``gn.config(executor=...,
device=...)`` checks its values with the executors and devices modules.  They
reach those implementations here, by name, and nowhere else:

>>> from gpunets import verbs
>>> verbs.get("fit").__module__
'gpunets.network'
>>> sorted(verbs.PROVIDERS)[:3]
['apply_gpu_memory', 'check_device', 'check_executor']

Each verb is resolved on first use from the module that provides it (importing
it then, so ``display.py`` and its Graphviz stay lazy) and cached.
:func:`provide` installs another implementation, e.g. in a test.  This module
imports nothing from gpunets, so every layer may use it.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

__all__ = ["PROVIDERS", "get", "provide"]

#: verb -> "module:attribute" of the implementation in an upper layer.
PROVIDERS: dict[str, str] = {
    "fit": "gpunets.network:fit",                           # node.fit(), mach.fit()
    "evaluate": "gpunets.network:evaluate",                 # node(...)
    "to_dot": "gpunets.display:to_dot",                     # node.to_dot()
    "repr_svg": "gpunets.display:repr_svg",                 # node._repr_svg_()
    "repr_html": "gpunets.display:repr_html",               # mach._repr_html_(), composites
    "mimebundle": "gpunets.display:mimebundle",             # node._repr_mimebundle_()
    "reject_fit_data": "gpunets.network:reject_fit_data",   # node.fit(X) / mach.fit(X): says where data goes
    "check_executor": "gpunets.executors:check_executor_spec",   # gn.config(executor=...)
    "check_device": "gpunets.devices:Device.parse",              # gn.config(device=...)
    "check_gpu_memory": "gpunets.gpu_memory:check_gpu_memory",   # gn.set_config(gpu_memory=...)
    "check_thread_unsafe": "gpunets.threadsafety:check_thread_unsafe_setting",   # gn.config(thread_unsafe=...)
    "apply_gpu_memory": "gpunets.gpu_memory:apply_gpu_memory",
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
