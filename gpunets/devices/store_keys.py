"""Stable names of hyperparameters and functions: what a store key (:mod:`gpunets.devices.store`) is made of.

The in-memory cache names functions by objects that live as long as the process (:func:`~gpunets.devices.cache.token`);
a store outlives the process, so its keys name everything by content, the same in every session:

* an estimator by its class and its ``get_params(deep=False)``, estimator-valued parameters (a pipeline's steps, a
  meta-estimator's ``estimator``) recursively;
* a library's class or function (the standard library, what is installed in site-packages, gpunets) by
  ``module:qualname``, its library's version being in the key (:func:`library_versions`);
* the user's own function by its code (bytecode, constants, names), defaults and closure, and by what it reads
  from its module (:func:`_feed_function`): the constants it names by value, the functions and classes it
  names recursively, a mutable object by its type only (what it holds at run time cannot be known here);
* the user's own class by its body: its methods (as functions) and class attributes, and its bases'
  (:func:`_feed_type`);
* a ``functools.partial`` by its function and arguments; arrays and frames by their content
  :func:`~gpunets.devices.fingerprint.fingerprint`; numbers, strings and ``None`` by type and value;
* any other object (a scorer, a splitter) by a hash of its pickle in which every function and class of the
  user's code is replaced by its key as above: a ``make_scorer`` metric is keyed by its code wherever it sits.

:func:`stable_key` returns None for what it cannot name the same way twice (an object that does not pickle) and
for what :func:`no_store` marks: nothing depending on it is stored.  :func:`library_versions` gives the versions of the libraries whose classes
a key named, so that an upgrade gives other keys.

>>> from sklearn.linear_model import Ridge
>>> stable_key(Ridge(alpha=2.0)) == stable_key(Ridge(alpha=2.0)), stable_key(Ridge()) == stable_key(Ridge(alpha=2.0))
(True, False)
"""

from __future__ import annotations

import contextlib
import dis
import functools
import hashlib
import math
import os
import sys
import types
from typing import Any

import numpy as np

from gpunets.devices.fingerprint import fingerprint

__all__ = ["stable_key", "library_versions", "no_store"]


class _Unnamed(Exception):
    """A value with no stable name: the key is None."""


class _State:
    """One key's walk: the libraries named, the user functions and classes being keyed (a function that calls
    itself, a method that names its class: a back-reference), the keys of the user code done already."""

    def __init__(self, libraries: set[str]) -> None:
        self.libs = libraries
        self.active: set[int] = set()
        self.done: dict[int, tuple[Any, bytes]] = {}


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
        _feed(h, value, _State(libraries if libraries is not None else set()), 0)
    except (_Unnamed, RecursionError):
        return None
    return h.digest()


def _part(h: Any, tag: bytes, data: bytes = b"") -> None:
    h.update(tag)
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def _is_estimator(v: Any) -> bool:
    return not isinstance(v, type) and callable(getattr(v, "get_params", None))


@functools.cache
def _library_roots() -> tuple[str, ...]:
    import site
    import sysconfig

    roots = {sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    with contextlib.suppress(Exception):
        roots.update(site.getsitepackages())
    with contextlib.suppress(Exception):
        roots.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots if r)


@functools.lru_cache(maxsize=4096)
def _is_library(top: str) -> bool:
    """Whether the top-level module ``top`` is a library (keyed by its version: the standard library, what is
    installed in site-packages, gpunets) rather than the user's own code (keyed by what its code is)."""
    if not top or top == "__main__":
        return False
    if top in sys.stdlib_module_names or top in sys.builtin_module_names or top == "gpunets":
        return True
    mod = sys.modules.get(top)
    if mod is None:
        return False
    file = getattr(mod, "__file__", None)
    if not isinstance(file, str):   # a namespace package, a frozen module: a library where it says its version
        return hasattr(mod, "__version__")
    return os.path.realpath(file).startswith(_library_roots())


def _library_of(obj: Any) -> str | None:
    """The top-level library ``obj`` (a class or function) comes from; None for the user's own code."""
    top = (getattr(obj, "__module__", None) or "").split(".")[0]
    return top if _is_library(top) else None


def _feed_type(h: Any, cls: type, st: _State, depth: int) -> None:
    """A class: by name where a library defines it; the user's own class also by its body (each method's code
    and what it reads, its class attributes), its bases' too, so an edit of the class gives another key."""
    mod = cls.__module__ or ""
    lib = _library_of(cls)
    _part(h, b"T", f"{mod}:{cls.__qualname__}".encode())
    if lib is not None:
        st.libs.add(lib)
        return
    if id(cls) in st.active:
        _part(h, b"R")
        return
    st.active.add(id(cls))
    try:
        for base in cls.__mro__[1:]:
            if base is not object:
                _feed_type(h, base, st, depth + 1)
        state = _written(cls)
        for name in sorted(vars(cls)):
            if name in _CLASS_SKIP or name in state:
                continue
            value = vars(cls)[name]
            if name.startswith("__") and name.endswith("__") and not isinstance(
                    value, (types.FunctionType, staticmethod, classmethod, property)):
                continue   # Python's bookkeeping (``__slotnames__``, set when an instance is first copied)
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = (value.fget, value.fset, value.fdel)
            _part(h, b"a", name.encode())
            _feed(h, value, st, depth + 1)
    finally:
        st.active.discard(id(cls))


def _written(cls: type) -> set[str]:
    """The attribute names the class's own functions assign or delete (``type(self).calls += 1``): state that
    changes as it runs, not part of what the class is (its methods' code, which sets it, is)."""
    out: set[str] = set()
    for value in vars(cls).values():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        code = getattr(value, "__code__", None)
        if isinstance(code, types.CodeType):
            out |= _stores(code)
    return out


def _stores(code: types.CodeType) -> set[str]:
    out = {i.argval for i in dis.get_instructions(code) if i.opname in ("STORE_ATTR", "DELETE_ATTR")}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _stores(c)
    return out


#: class attributes that say nothing about what the class does (or change with the lines above it)
_CLASS_SKIP = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__", "_abc_impl",
                         "__firstlineno__", "__static_attributes__", "__orig_bases__", "__parameters__",
                         "__abstractmethods__", "__slots__", "__annotations__"})


def _feed(h: Any, v: Any, st: _State, depth: int) -> None:
    if depth > 60:
        raise _Unnamed
    if not _constant(v) and getattr(v, _EXEMPT, True) is False:   # gn.no_store: nothing depending on it stored
        raise _Unnamed
    libs = st.libs
    d = depth + 1
    if v is None or isinstance(v, (bool, int, str, bytes)):
        _part(h, b"v", f"{type(v).__name__}:{v!r}".encode())
    elif isinstance(v, float):
        _part(h, b"f", b"nan" if math.isnan(v) else float(v).hex().encode())
    elif _is_estimator(v):
        _part(h, b"E")
        _feed_type(h, type(v), st, d)
        try:
            params = v.get_params(deep=False)
        except Exception as e:  # noqa: BLE001 - an estimator whose params cannot be read
            raise _Unnamed from e
        for k in sorted(params):
            _part(h, b"k", str(k).encode())
            _feed(h, params[k], st, d)
    elif isinstance(v, (list, tuple)):
        _part(h, b"L", type(v).__name__.encode() + str(len(v)).encode())
        for x in v:
            _feed(h, x, st, d)
    elif isinstance(v, dict):
        _part(h, b"D", str(len(v)).encode())
        for k in sorted(v, key=repr):
            _part(h, b"k", repr(k).encode())
            _feed(h, v[k], st, d)
    elif isinstance(v, type):
        _feed_type(h, v, st, d)
    elif isinstance(v, functools.partial):
        _part(h, b"P")
        _feed(h, v.func, st, d)
        _feed(h, v.args, st, d)
        _feed(h, dict(v.keywords), st, d)
    elif isinstance(v, types.ModuleType):
        _part(h, b"M", v.__name__.encode())
        if _is_library(v.__name__.split(".")[0]):
            libs.add(v.__name__.split(".")[0])
    elif callable(v) and (name := _global_name(v)) is not None and _library_of(v) is not None:
        libs.add(name.split(":")[0].split(".")[0])
        _part(h, b"G", name.encode())
    elif isinstance(v, types.FunctionType):
        _feed_function(h, v, st, d)
    elif isinstance(v, types.MethodType):   # a bound method: its function and the object it is bound to
        _part(h, b"B")
        _feed(h, v.__func__, st, d)
        _feed(h, v.__self__, st, d)
    elif isinstance(v, types.CodeType):
        _code(h, v, st, d)
    elif isinstance(v, np.ndarray) or hasattr(v, "__array_namespace__") or type(v).__module__.split(".")[0] in (
            "pandas", "scipy", "cupy", "cudf"):
        _part(h, b"A", repr(fingerprint(v)).encode())
    elif isinstance(v, np.generic):
        _part(h, b"n", f"{v.dtype.str}:{v!r}".encode())
    else:   # any other object (a scorer, a splitter...): its pickle, each function and class in it keyed as here
        _feed_type(h, type(v), st, d)
        _part(h, b"O", _pickle_key(v, st, d))


def _feed_function(h: Any, f: types.FunctionType, st: _State, depth: int) -> None:
    """The user's function: its code, defaults and closure, and what it reads from its module (the globals its
    code names, the user's functions and classes among them recursively; a module's attributes it names)."""
    if id(f) in st.active:   # it calls itself (or a helper that calls it back)
        _part(h, b"R", (f.__qualname__ or "").encode())
        return
    done = st.done.get(id(f))
    if done is not None and done[0] is f:
        _part(h, b"F", done[1])
        return
    st.active.add(id(f))
    try:
        sub = hashlib.blake2b(digest_size=16)
        _code(sub, f.__code__, st, depth)
        _feed(sub, f.__defaults__, st, depth)
        _feed(sub, f.__kwdefaults__, st, depth)
        for cell in f.__closure__ or ():
            try:
                _feed(sub, cell.cell_contents, st, depth)
            except ValueError:   # an empty cell
                _part(sub, b"empty")
        names = _names(f.__code__)
        g = f.__globals__
        for name in sorted(names):
            if name not in g:   # a builtin, or an attribute name
                continue
            value = g[name]
            _part(sub, b"g", name.encode())
            if isinstance(value, types.ModuleType) and not _is_library(value.__name__.split(".")[0]):
                _part(sub, b"M", value.__name__.encode())   # the user's module: the attributes read from it
                for attr in sorted(names):
                    if attr in vars(value) and not isinstance(vars(value)[attr], types.ModuleType):
                        _part(sub, b"m", attr.encode())
                        _feed_global(sub, vars(value)[attr], st, depth + 1)
            else:
                _feed_global(sub, value, st, depth + 1)
        digest = sub.digest()
    finally:
        st.active.discard(id(f))
    st.done[id(f)] = (f, digest)
    _part(h, b"F", digest)


def _feed_global(h: Any, value: Any, st: _State, depth: int) -> None:
    """A value a function reads from its module: a constant (numbers, strings, tuples of them) by value, a
    function, class or module as everywhere here; a mutable object (a dict, a list, an array, an instance) only
    by its type: what it holds when the function runs cannot be known from here (a counter, a cache), so it is
    not in the key (docs/store.md, "What a key cannot see"; :func:`no_store` opts such code out)."""
    if _constant(value) or isinstance(value, (type, types.FunctionType, types.ModuleType, functools.partial)) \
            or (callable(value) and _global_name(value) is not None and _library_of(value) is not None):
        _feed(h, value, st, depth)
    else:
        if getattr(value, _EXEMPT, True) is False:
            raise _Unnamed
        _part(h, b"mutable")
        _feed_type(h, type(value), st, depth)


def _constant(v: Any) -> bool:
    """An immutable value: None, a number, a string, bytes, a NumPy scalar, a tuple or frozenset of them."""
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes, np.generic)):
        return True
    return isinstance(v, (tuple, frozenset)) and all(_constant(x) for x in v)


#: the attribute :func:`no_store` sets
_EXEMPT = "__gpunets_store__"


def no_store(obj: Any) -> Any:
    """Mark ``obj`` (a function, a class, an estimator, a scorer) as not to be stored: no fit that depends on it
    is looked up in or written to the store of fitted states (:class:`~gpunets.Store`).  For code whose result
    depends on what a key cannot see (docs/store.md): a mutable object it reads, a C function, a file.  Returns
    ``obj`` (usable as a decorator).

    Examples
    --------
    >>> import gpunets as gn
    >>> @gn.no_store
    ... def features(X):
    ...     return X * 2
    >>> stable_key(features) is None
    True
    """
    try:
        setattr(obj, _EXEMPT, False)
    except (AttributeError, TypeError) as e:
        msg = (f"no_store({obj!r}): a {type(obj).__name__} takes no attribute, so it cannot be marked. Hint: mark "
               "the function, class or estimator that uses it instead, or wrap it in a function of your own.")
        raise TypeError(msg) from e
    return obj


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names ``code`` (and the functions defined in it) uses."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _code(h: Any, code: types.CodeType, st: _State, depth: int) -> None:
    _part(h, b"C", code.co_code)
    _part(h, b"n", repr((code.co_names, code.co_varnames, code.co_argcount, code.co_kwonlyargcount)).encode())
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code(h, c, st, depth + 1)
        else:
            _feed(h, c, st, depth + 1)


def _pickle_key(v: Any, st: _State, depth: int) -> bytes:
    """The hash of ``v``'s pickle in which every function and class is replaced by its key here: a library's by
    name, the user's by its code (so a scorer's metric, a splitter's function are keyed as a hyperparameter's).
    Raises :class:`_Unnamed` when ``v`` does not pickle."""
    try:
        hasher = _hasher_class()(st, depth + 1)
        return str(hasher.hash(v)).encode()
    except _Unnamed:
        raise
    except Exception as e:  # noqa: BLE001 - an object that does not pickle: no key
        raise _Unnamed from e


@functools.lru_cache(maxsize=1)
def _hasher_class() -> type:
    """joblib's hasher of pickles (NumPy arrays by their bytes, dicts and sets in a stable order), with every
    function and class of the user's code replaced by its key here (:func:`_pickle_key`)."""
    from joblib.hashing import NumpyHasher  # noqa: PLC0415 - a scikit-learn dependency

    class Hasher(NumpyHasher):  # type: ignore[misc, valid-type]
        def __init__(self, st: _State, depth: int) -> None:
            super().__init__(hash_name="md5")
            self.st, self.depth = st, depth

        def save(self, obj: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(obj, (type, types.FunctionType)):
                lib = _library_of(obj)
                if lib is not None and (isinstance(obj, type) or _global_name(obj) is not None):
                    self.st.libs.add(lib)   # pickled by name; its library's version is in the key
                else:
                    sub = hashlib.blake2b(digest_size=16)
                    _feed(sub, obj, self.st, self.depth)
                    obj = ("gpunets-key", sub.hexdigest())
            super().save(obj, *args, **kwargs)

    return Hasher


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


def library_versions(libraries: set[str]) -> bytes:
    """``name=version`` of each library in ``libraries`` (as imported here), sorted, as bytes.

    >>> library_versions({"numpy"}).startswith(b"numpy=")
    True
    """
    return ";".join(f"{lib}={_version(lib)}" for lib in sorted(libraries)).encode()


def _version(lib: str) -> str:
    """``lib``'s version: its ``__version__``, its distribution's, Python's for the standard library."""
    mod = sys.modules.get(lib)
    v = getattr(mod, "__version__", None)
    return v if isinstance(v, str) else _other_version(lib)


@functools.lru_cache(maxsize=1024)
def _other_version(lib: str) -> str:
    if lib in sys.stdlib_module_names or lib in sys.builtin_module_names:
        return "python" + sys.version.split()[0]
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version(lib)
    except (PackageNotFoundError, ValueError):
        return "?"
