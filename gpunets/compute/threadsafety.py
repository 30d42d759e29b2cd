"""Estimators that must not run concurrently with one another: a registry and its locks.

Some estimators keep state for the whole process, so two of them fitted at
the same time on two threads give other results than one after the other:

* **liblinear** (``LinearSVC``, ``LinearSVR``, ``LogisticRegression`` /
  ``LogisticRegressionCV`` with ``solver="liblinear"``): its solvers shuffle
  with one process-wide random state, seeded at the start of each fit
  (scikit-learn issues 8410 and 31883).
* **libsvm** (``SVC`` / ``NuSVC`` with ``probability=True``): the internal
  cross-validation that calibrates the probabilities shuffles with libsvm's
  own process-wide random state.

Each such *group* has one lock; :func:`serialized` takes the locks of an
estimator's groups around its fit (and, for groups a user declares, around
its calls), in :mod:`gpunets.compute.estimators`, the one place estimators are fitted
and applied, so every executor honours it.  Scikit-learn meta-estimators
(``Pipeline``, ``OneVsRestClassifier``, ...) are looked into: a pipeline
ending in ``LinearSVC`` is in the liblinear group.

Users add their own with the ``thread_unsafe`` setting (classes or dotted
names: ``gn.set_config(thread_unsafe=[MyModel])``), or with a class attribute
``__gpunets_thread_safe__ = False`` (its own group) or ``= "liblinear"`` (a
named group shared with others).

>>> from sklearn.svm import LinearSVR, SVC
>>> from sklearn.linear_model import LogisticRegression, Ridge
>>> unsafe_groups(LinearSVR()), unsafe_groups(Ridge())
(('liblinear',), ())
>>> unsafe_groups(LogisticRegression(solver="liblinear")), unsafe_groups(LogisticRegression())
(('liblinear',), ())
>>> unsafe_groups(SVC(probability=True)), unsafe_groups(SVC())
(('libsvm',), ())
"""

from __future__ import annotations

import contextvars
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gpunets.base.config import get_config

__all__ = ["unsafe_groups", "serialized", "BUILTIN_THREAD_UNSAFE", "check_thread_unsafe_setting"]

# (public module, class name) -> (group, condition on the estimator or None for always)
BUILTIN_THREAD_UNSAFE: dict[tuple[str, str], tuple[str, Callable[[Any], bool] | None]] = {
    ("sklearn.svm", "LinearSVC"): ("liblinear", None),
    ("sklearn.svm", "LinearSVR"): ("liblinear", None),
    ("sklearn.linear_model", "LogisticRegression"): ("liblinear", lambda e: getattr(e, "solver", None) == "liblinear"),
    ("sklearn.linear_model", "LogisticRegressionCV"): ("liblinear",
                                                       lambda e: getattr(e, "solver", None) == "liblinear"),
    ("sklearn.svm", "SVC"): ("libsvm", lambda e: getattr(e, "probability", False) is True),
    ("sklearn.svm", "NuSVC"): ("libsvm", lambda e: getattr(e, "probability", False) is True),
}

_BUILTIN_CLASSES: list[tuple[type, str, Callable[[Any], bool] | None]] | None = None


def _builtin_classes() -> list[tuple[type, str, Callable[[Any], bool] | None]]:
    global _BUILTIN_CLASSES
    if _BUILTIN_CLASSES is None:
        import importlib

        found = []
        for (mod, name), (group, cond) in BUILTIN_THREAD_UNSAFE.items():
            cls = getattr(importlib.import_module(mod), name, None)
            if cls is not None:
                found.append((cls, group, cond))
        _BUILTIN_CLASSES = found
    return _BUILTIN_CLASSES


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def check_thread_unsafe_setting(value: Any) -> tuple[Any, ...]:
    """The ``thread_unsafe`` setting as a tuple of classes and dotted names, or a ``TypeError``."""
    items = (value,) if isinstance(value, (str, type)) else value
    try:
        items = tuple(items)
    except TypeError:
        items = None  # type: ignore[assignment]
    bad = [x for x in items if not (isinstance(x, type) or (isinstance(x, str) and "." in x))] if items else []
    if items is None or bad:
        what = bad[0] if bad else value
        msg = (f"thread_unsafe={value!r}: {what!r} is not an estimator class or a dotted class name. "
               "Give a list of classes or names such as [MyModel, 'mypackage.models.OtherModel'].")
        raise TypeError(msg)
    return items


def _declared(est: Any, setting: tuple[Any, ...]) -> str | None:
    """The group a user declared for ``est`` (attribute or setting), or None."""
    flag = getattr(type(est), "__gpunets_thread_safe__", True)
    if flag is False:
        for c in type(est).__mro__:   # the class that declared it names the group
            if c.__dict__.get("__gpunets_thread_safe__", True) is False:
                return _qualname(c)
    if isinstance(flag, str):
        return flag
    for entry in setting:
        if isinstance(entry, type):
            if isinstance(est, entry):
                return _qualname(entry)
        elif any(_qualname(c) == entry for c in type(est).__mro__):
            return entry
    return None


def _walk(est: Any, setting: tuple[Any, ...], out: set[str]) -> None:
    declared = _declared(est, setting)
    if declared is not None:
        out.add(declared)
    if "sklearn" not in sys.modules:
        return
    for cls, group, cond in _builtin_classes():
        if isinstance(est, cls) and (cond is None or cond(est)):
            out.add(group)
    # look into scikit-learn meta-estimators (never into user or gpunets models: they decide for themselves)
    if not type(est).__module__.startswith("sklearn."):
        return
    # its attributes, not get_params (which inspects the signature: ~100x slower); the estimator is
    # fresh (unfitted) when it is fitted, so its attributes are its parameters
    for v in list(getattr(est, "__dict__", {}).values()):
        for item in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(item, tuple) and len(item) >= 2:   # (name, estimator[, columns]) as in Pipeline
                item = item[1]
            if callable(getattr(item, "fit", None)) and not isinstance(item, type):   # not a MetadataRequest
                _walk(item, setting, out)


def unsafe_groups(est: Any, *, calls: bool = False) -> tuple[str, ...]:
    """The lock groups ``est`` must hold while it is fitted (``calls=True``: while it is applied).

    Built-in groups guard fits only (their process-wide state is used while
    fitting); groups declared by a user guard fits and calls.
    """
    setting = get_config().get("thread_unsafe", ())
    if calls:
        declared = _declared(est, setting)
        return (declared,) if declared is not None else ()
    out: set[str] = set()
    _walk(est, setting, out)
    return tuple(sorted(out))


class _Hold:
    """The locks of the groups below one holder: nested runs inside a held fit use their own."""

    __slots__ = ("children", "mutex")

    def __init__(self) -> None:
        self.children: dict[str, threading.Lock] = {}
        self.mutex = threading.Lock()

    def lock(self, group: str) -> threading.Lock:
        with self.mutex:
            lk = self.children.get(group)
            if lk is None:
                lk = self.children[group] = threading.Lock()
            return lk


_ROOT = _Hold()
_HELD: contextvars.ContextVar[dict[str, _Hold] | None] = contextvars.ContextVar("gpunets_held_groups", default=None)


@contextmanager
def serialized(groups: tuple[str, ...]) -> Iterator[None]:
    """Hold the locks of ``groups`` (in name order, so two holders cannot deadlock).

    A network run inside a held fit (a model whose fit trains a network) sees
    the hold through its context; its own tasks of the same group take a lock
    of their own below it, so they run one at a time among themselves instead
    of waiting forever for the holder.
    """
    if not groups:
        yield
        return
    held = _HELD.get() or {}
    mine = dict(held)
    taken: list[threading.Lock] = []
    try:
        for g in sorted(set(groups)):
            lk = held.get(g, _ROOT).lock(g)
            lk.acquire()
            taken.append(lk)
            mine[g] = _Hold()
        token = _HELD.set(mine)
        try:
            yield
        finally:
            _HELD.reset(token)
    finally:
        for lk in reversed(taken):
            lk.release()
