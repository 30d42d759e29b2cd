"""Warnings that point at the user's line and are not repeated.

``stacklevel`` is computed by walking out of the gpunets package (Python 3.12's
``skip_file_prefixes`` does this, but 3.11 is supported), so a warning shows the
line in the user's script or notebook cell that started the fit, not
``gpunets/planning/plan.py``.  :func:`warn_once` emits a warning once per key.

>>> import warnings
>>> with warnings.catch_warnings(record=True) as w:
...     warnings.simplefilter("always")
...     for _ in range(3):
...         _ = warn_once(("doc", 1), "once", UserWarning)
>>> len(w)
1
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Hashable
from types import FrameType
from typing import Any

__all__ = ["warn_user", "warn_once", "fallback_owner", "remember_user_site"]

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep   # the gpunets package
_SEEN: set[Hashable] = set()
_SEEN_BY: weakref.WeakKeyDictionary[Any, set] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()

# The user's estimator whose own network is being fitted (a composite): warnings name it, and repeat once.
_OWNER: contextvars.ContextVar[Any] = contextvars.ContextVar("gpunets_fallback_owner", default=None)


# Where the user called fit or evaluate: warnings raised on worker threads (a composite's own fit inside a
# task) have no user frame on their stack, so they point here.
_SITE: contextvars.ContextVar[Any] = contextvars.ContextVar("gpunets_user_site", default=None)


def fallback_owner() -> Any:
    return _OWNER.get()


def remember_user_site() -> None:
    """Record the first frame outside gpunets as the place later warnings of this run point at."""
    f: FrameType | None = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG):
        f = f.f_back
    if f is not None:
        _SITE.set((f.f_code.co_filename, f.f_lineno, f.f_globals))


def _warn(msg: str, category: type[Warning]) -> None:
    f: FrameType | None = sys._getframe(0)
    level = 1
    # out of gpunets, and out of the standard library's context managers gpunets' own `with` blocks use
    while f is not None and (f.f_code.co_filename.startswith(_PKG) or f.f_code.co_filename == contextlib.__file__):
        f = f.f_back
        level += 1
    site = _SITE.get()
    on_worker = f is None or f.f_code.co_filename in _THREAD_FILES
    if on_worker and site is not None:   # a worker thread: point at the user's fit call
        filename, lineno, g = site
        warnings.warn_explicit(msg, category, filename, lineno, module=g.get("__name__"),
                               registry=g.setdefault("__warningregistry__", {}), module_globals=g)
    else:
        warnings.warn(msg, category, stacklevel=level if f is not None else 1)


_THREAD_FILES = {threading.__file__, contextvars.__file__ if hasattr(contextvars, "__file__") else ""}


def warn_user(msg: str, category: type[Warning]) -> None:
    """``warnings.warn`` pointing at the first frame outside gpunets."""
    _warn(msg, category)


def warn_once(key: Hashable, msg: str, category: type[Warning], owner: Any = None) -> bool:
    """Warn once per ``key`` (per ``owner`` object when given, for as long as it lives); True if it warned."""
    with _LOCK:
        if owner is not None:
            try:
                seen = _SEEN_BY.setdefault(owner, set())
            except TypeError:   # not weak-referenceable: key on its identity for the process
                seen, key = _SEEN, (id(owner), key)
        else:
            seen = _SEEN
        if key in seen:
            return False
        seen.add(key)
    _warn(msg, category)
    return True
