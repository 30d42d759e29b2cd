"""Stable names of hyperparameters and functions: what a store key (:mod:`gpunets.devices.store`) is made of.

The in-memory cache names functions by objects that live as long as the process (:func:`~gpunets.devices.cache.token`);
a store outlives the process, so its keys name everything by content, the same in every session:

* an estimator by its class (module and qualified name) and its ``get_params(deep=False)``, estimator-valued
  parameters (a pipeline's steps, a meta-estimator's ``estimator``) recursively;
* a function by ``module:qualname`` where that name holds it and its library has a version (``np.log``),
  else (the user's own functions) by its code (bytecode,
  constants, names) and defaults, and the values its closure holds, as the cache names functions by code and
  defaults; a ``functools.partial`` by its function and arguments;
* arrays and frames by their content :func:`~gpunets.devices.fingerprint.fingerprint`; numbers, strings and
  ``None`` by type and value; other objects by a hash of their pickle.

:func:`stable_key` returns None for what it cannot name the same way twice (an object that does not pickle):
nothing depending on it is stored.  :func:`library_versions` gives the versions of the libraries whose classes
a key named, so that an upgrade gives other keys.

>>> from sklearn.linear_model import Ridge
>>> stable_key(Ridge(alpha=2.0)) == stable_key(Ridge(alpha=2.0)), stable_key(Ridge()) == stable_key(Ridge(alpha=2.0))
(True, False)
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys
import types
from typing import Any

import numpy as np

from gpunets.devices.fingerprint import fingerprint

__all__ = ["stable_key", "library_versions"]


class _Unnamed(Exception):
    """A value with no stable name: the key is None."""


def stable_key(value: Any, libraries: set[str] | None = None) -> bytes | None:
    """A 128-bit digest of ``value`` that is the same in every process (see the module docstring), or None.

    ``libraries`` (a set) receives the top-level package of every class and function named.

    Examples
    --------
    >>> import numpy as np
    >>> stable_key(np.log) == stable_key(np.log), stable_key(lambda x: x + 1) == stable_key(lambda x: x + 2)
    (True, False)
    >>> libs = set()
    >>> from sklearn.preprocessing import StandardScaler
    >>> _ = stable_key(StandardScaler(), libs); sorted(libs)
    ['sklearn']
    """
    h = hashlib.blake2b(digest_size=16)
    try:
        _feed(h, value, libraries if libraries is not None else set(), 0)
    except (_Unnamed, RecursionError):
        return None
    return h.digest()


def _part(h: Any, tag: bytes, data: bytes = b"") -> None:
    h.update(tag)
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def _is_estimator(v: Any) -> bool:
    return not isinstance(v, type) and callable(getattr(v, "get_params", None))


def _class_name(cls: type, libraries: set[str]) -> bytes:
    mod = cls.__module__ or ""
    libraries.add(mod.split(".")[0])
    return f"{mod}:{cls.__qualname__}".encode()


def _feed(h: Any, v: Any, libs: set[str], depth: int) -> None:
    if depth > 50:
        raise _Unnamed
    d = depth + 1
    if v is None or isinstance(v, (bool, int, str, bytes)):
        _part(h, b"v", f"{type(v).__name__}:{v!r}".encode())
    elif isinstance(v, float):
        _part(h, b"f", b"nan" if math.isnan(v) else float(v).hex().encode())
    elif _is_estimator(v):
        _part(h, b"E", _class_name(type(v), libs))
        try:
            params = v.get_params(deep=False)
        except Exception as e:  # noqa: BLE001 - an estimator whose params cannot be read
            raise _Unnamed from e
        for k in sorted(params):
            _part(h, b"k", str(k).encode())
            _feed(h, params[k], libs, d)
    elif isinstance(v, (list, tuple)):
        _part(h, b"L", type(v).__name__.encode() + str(len(v)).encode())
        for x in v:
            _feed(h, x, libs, d)
    elif isinstance(v, dict):
        _part(h, b"D", str(len(v)).encode())
        for k in sorted(v, key=repr):
            _part(h, b"k", repr(k).encode())
            _feed(h, v[k], libs, d)
    elif isinstance(v, type):
        _part(h, b"T", _class_name(v, libs))
    elif isinstance(v, functools.partial):
        _part(h, b"P")
        _feed(h, v.func, libs, d)
        _feed(h, v.args, libs, d)
        _feed(h, dict(v.keywords), libs, d)
    elif callable(v) and (name := _global_name(v)) is not None and _versioned(v):
        libs.add(name.split(":")[0].split(".")[0])
        _part(h, b"G", name.encode())
    elif isinstance(v, types.FunctionType):
        _part(h, b"F")
        _code(h, v.__code__, libs, d)
        _feed(h, v.__defaults__, libs, d)
        _feed(h, v.__kwdefaults__, libs, d)
        for cell in v.__closure__ or ():
            try:
                _feed(h, cell.cell_contents, libs, d)
            except ValueError:   # an empty cell
                _part(h, b"empty")
    elif isinstance(v, types.CodeType):
        _code(h, v, libs, d)
    elif isinstance(v, np.ndarray) or hasattr(v, "__array_namespace__") or type(v).__module__.split(".")[0] in (
            "pandas", "scipy", "cupy", "cudf"):
        _part(h, b"A", repr(fingerprint(v)).encode())
    elif isinstance(v, np.generic):
        _part(h, b"n", f"{v.dtype.str}:{v!r}".encode())
    else:
        fp = fingerprint(v)   # joblib's hash of its pickle; an unpicklable object is named by id: no key
        if isinstance(fp, tuple) and fp and fp[0] == "object":
            raise _Unnamed
        libs.add(type(v).__module__.split(".")[0])
        _part(h, b"O", _class_name(type(v), libs) + repr(fp).encode())


def _code(h: Any, code: types.CodeType, libs: set[str], depth: int) -> None:
    _part(h, b"C", code.co_code)
    _part(h, b"n", repr((code.co_names, code.co_varnames, code.co_argcount, code.co_kwonlyargcount)).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code(h, c, libs, depth + 1)
        else:
            _feed(h, c, libs, depth + 1)


def _global_name(f: Any) -> str | None:
    """``module:qualname`` when ``f`` is the object that name holds, else None."""
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None)
    if not isinstance(name, str) or "<" in name:
        return None
    for mod in (getattr(f, "__module__", None), type(f).__module__):
        if not isinstance(mod, str) or mod == "__main__":
            continue
        obj: Any = sys.modules.get(mod)
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is f:
            return f"{mod}:{name}"
    return None


def _versioned(f: Any) -> bool:
    """A builtin, or a function of a library with a version (its version is in the key): named by name.

    A function of the user's own code is named by its code, so an edit gives another key."""
    if not isinstance(f, types.FunctionType):
        return True
    mod = sys.modules.get((getattr(f, "__module__", None) or "").split(".")[0])
    return mod is not None and hasattr(mod, "__version__")


def library_versions(libraries: set[str]) -> bytes:
    """``name=version`` of each library in ``libraries`` (as imported here), sorted, as bytes.

    >>> library_versions({"numpy"}).startswith(b"numpy=")
    True
    """
    out = []
    for lib in sorted(libraries):
        mod = sys.modules.get(lib)
        out.append(f"{lib}={getattr(mod, '__version__', '?')}")
    return ";".join(out).encode()
