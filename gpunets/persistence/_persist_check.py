"""A file checked as a whole before anything in it runs: what :func:`gpunets.load` reads before it builds.

Three checks, all refusing with the name that is the culprit (:class:`Unsafe`, :class:`Untrusted`):

* :func:`check_pickle` reads a pickle's opcodes (:func:`pickletools.genops`, nothing is executed) and follows
  its stack: every global it names must be admitted, and it may *call* only what builds plain data
  (NumPy's and ``copyreg``'s reconstructors, builtin containers, ``functools.partial``, the classes it
  builds with ``__new__``); a function is never called while a file loads, a global is never altered
  (``BUILD`` on a class or function), and items are added only to containers the file built.
* :func:`check_skops` reads a skops payload's schema: no bound method, ``operator`` object or
  constructor call (``ConstructorFromReduceNode``) of anything but builtin data types, and nothing
  :data:`~gpunets.persistence._persist_trust.NEVER` names.
* :func:`check_archive` walks the built (not yet run) object graph: a function that calls what its
  arguments name (declared by :func:`~gpunets.base.saved.saved_operation`'s ``checked=``) may only be a
  node's operation, with those arguments written in the file and of their kind (a machine operation
  by name, a kernel, a parameter name, a callable that is not itself dispatching); a scorer's response
  method is an operation; no module is part of the graph.
"""

from __future__ import annotations

import functools
import inspect
import io
import json
import keyword
import pickletools
import types
import zipfile
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from gpunets.core.machines import OPERATIONS
from gpunets.core.ops import KERNELS
from gpunets.persistence._persist_codec import Archive, Items, Record, Ref
from gpunets.persistence._persist_trust import (
    canonical,
    checked_arguments,
    is_dispatching,
    never_reason,
    resolve,
)

__all__ = ["Unsafe", "Untrusted", "check_pickle", "check_skops", "check_archive", "PICKLE_HELPERS"]


class Unsafe(Exception):
    """A trusted name used to do what a file may not: ``name`` is the culprit, ``why`` says what it tried."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: {why}")
        self.name, self.why = name, why


class Untrusted(Exception):
    """A name that is not trusted (the caller may trust it by name)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


#: What a pickle of NumPy arrays, scikit-learn estimators and gpunets' objects calls to build them: each
#: builds data (a new object of a class the file names, with ``__new__``; an array from bytes; a container).
PICKLE_HELPERS = frozenset({
    "copyreg._reconstructor", "copyreg.__newobj__", "builtins.object", "builtins.set", "builtins.frozenset",
    "builtins.slice", "builtins.complex", "builtins.bytearray", "builtins.range", "builtins.dict",
    "builtins.list", "builtins.tuple", "builtins.int", "builtins.float", "builtins.str", "builtins.bytes",
    "builtins.bool", "collections.OrderedDict", "collections.defaultdict", "functools.partial",
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "numpy.dtype", "numpy.ndarray",
    "numpy.core.numeric._frombuffer", "numpy._core.numeric._frombuffer", "numpy.ma.core._mareconstruct",
    "numpy.random._pickle.__bit_generator_ctor", "numpy.random._pickle.__generator_ctor",
    "numpy.random._pickle.__randomstate_ctor",
})

#: Builtin types ``copyreg._reconstructor`` may build an object on (it calls ``base.__init__``).
_PLAIN_BASES = frozenset({"builtins.object", "builtins.dict", "builtins.list", "builtins.set", "builtins.tuple",
                          "builtins.int", "builtins.float", "builtins.str", "builtins.bytes",
                          "builtins.frozenset"})

#: The packages whose names a pickle's check looks up (imports); any other name is refused unread.
_LOOKED_UP = frozenset({"gpunets", "numpy", "sklearn", "scipy", "pandas", "builtins", "copyreg", "collections",
                        "functools", "_operator", "operator"})

# helpers whose first argument is the class they build (with __new__ only)
_BUILDS_CLASS_ARG = frozenset({"copyreg._reconstructor", "copyreg.__newobj__", "numpy.core.multiarray._reconstruct",
                               "numpy._core.multiarray._reconstruct", "numpy.ma.core._mareconstruct"})


# ----------------------------------------------------------------- pickle: the opcodes, not run


class _Global:
    __slots__ = ("name", "obj")

    def __init__(self, name: str, obj: Any) -> None:
        self.name, self.obj = name, obj


class _Made:
    """An object the file built (by a call or ``__new__``); ``cls`` its class where known."""

    __slots__ = ("cls",)

    def __init__(self, cls: Any) -> None:
        self.cls = cls


class _Tuple:
    __slots__ = ("items",)

    def __init__(self, items: list[Any]) -> None:
        self.items = items


class _Container:
    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind


_MARK = object()
_OTHER = object()
_PUSH_CONST = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "STRING", "BINSTRING",
               "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8", "UNICODE",
               "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "FLOAT", "BINFLOAT", "NONE", "NEWTRUE",
               "NEWFALSE"}
_NOOP = {"PROTO", "FRAME", "STOP", "READONLY_BUFFER"}


def _adds_plainly(cls: Any, kind: str) -> bool:
    """Whether items added to an object of ``cls`` (APPENDS, SETITEMS, ADDITEMS) go in as a container's do."""
    if not isinstance(cls, type):
        return False
    if kind == "list":
        return issubclass(cls, list) and cls.append is list.append and cls.extend is list.extend   # type: ignore[comparison-overlap]
    if kind == "dict":
        return issubclass(cls, dict) and cls.__setitem__ in (dict.__setitem__, _odict_setitem())
    return issubclass(cls, (set, frozenset)) and getattr(cls, "add", None) is set.add


@functools.lru_cache(maxsize=1)
def _odict_setitem() -> Any:
    import collections

    return collections.OrderedDict.__setitem__


def check_pickle(payload: bytes, admit: Callable[[str], bool], named: Iterable[str]) -> None:
    """Check a whole pickle without running it: raise :class:`Untrusted` or :class:`Unsafe` naming the culprit.

    ``admit(name)`` says whether a global may be named at all; ``named`` are the names the caller trusts
    outright (they may also be called while loading, as a pickle calls what it names).
    """
    named = set(named)
    stack: list[Any] = []
    memo: dict[int, Any] = {}

    def pop_mark() -> list[Any]:
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is _MARK:
                items = stack[i + 1:]
                del stack[i:]
                return items
        raise Unsafe("(pickle)", "its opcodes are malformed (no MARK)")

    def glob(name: str) -> _Global:
        why = never_reason(name)
        if why is not None:
            raise Unsafe(name, f"it is never loaded: {why}")
        # only the packages a trusted name can come from are imported to look a name up (an import runs code)
        obj = resolve(name) if name.split(".")[0] in _LOOKED_UP or name in named else None
        real = canonical(obj) if obj is not None else name
        why = never_reason(real)
        if why is not None:
            raise Unsafe(name, f"it is {real}, which is never loaded: {why}")
        if not admit(name):
            raise Untrusted(name)
        return _Global(name, obj)

    def call(fn: Any, args: Any, how: str) -> Any:
        if not isinstance(fn, _Global):
            raise Unsafe("(pickle)", f"it {how} a value the file computed (only names it holds may be called)")
        name = fn.name
        if name in named:
            return _Made(fn.obj if isinstance(fn.obj, type) else None)
        if name in PICKLE_HELPERS:
            if name == "copyreg._reconstructor" and isinstance(args, _Tuple) and len(args.items) >= 2:
                base = args.items[1]
                if not (isinstance(base, _Global) and base.name in _PLAIN_BASES):
                    raise Unsafe(name, "it builds an object on a base class that is not a builtin data type")
            if name in _BUILDS_CLASS_ARG:
                first = args.items[0] if isinstance(args, _Tuple) and args.items else None
                if not isinstance(first, _Global) or not isinstance(first.obj, type):
                    raise Unsafe(name, "it builds an object of a class the file computed")
                return _Made(first.obj)
            return _Made(fn.obj if isinstance(fn.obj, type) else None)
        obj = fn.obj
        if isinstance(obj, type) and how == "builds with __new__":
            return _Made(obj)
        if isinstance(obj, type) and _builds_data_when_called(obj):
            return _Made(obj)
        what = "class" if isinstance(obj, type) else "function"
        raise Unsafe(name, f"the file calls this {what} while it loads ({how}); gn.load never calls a trusted "
                           f"function, or a class's constructor, while loading a file")

    ops = pickletools.genops(payload)
    for op, raw, _pos in ops:
        arg: Any = raw
        code = op.name
        if code in _PUSH_CONST:   # the most frequent opcodes first
            stack.append(("const", arg))
        elif code == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif code in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in memo:
                raise Unsafe("(pickle)", "its opcodes are malformed (a memo entry read before it is written)")
            stack.append(memo[arg])
        elif code in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = stack[-1]
        elif code in _NOOP:
            if code == "STOP":
                break
        elif code in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET"):
            stack.append(_Container(code[6:].lower()))
        elif code == "EMPTY_TUPLE":
            stack.append(_Tuple([]))
        elif code == "MARK":
            stack.append(_MARK)
        elif code == "POP":
            stack.pop()
        elif code == "POP_MARK":
            pop_mark()
        elif code == "DUP":
            stack.append(stack[-1])
        elif code == "TUPLE":
            stack.append(_Tuple(pop_mark()))
        elif code in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(code[-1])
            items = stack[-n:]
            del stack[-n:]
            stack.append(_Tuple(items))
        elif code == "LIST":
            pop_mark()
            stack.append(_Container("list"))
        elif code == "DICT":
            pop_mark()
            stack.append(_Container("dict"))
        elif code == "FROZENSET":
            pop_mark()
            stack.append(_OTHER)
        elif code in ("APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS"):
            if code in ("APPENDS", "SETITEMS", "ADDITEMS"):
                pop_mark()
            else:
                del stack[-(1 if code == "APPEND" else 2):]
            kind = {"A": "list", "S": "dict"}.get(code[0], "set") if code != "ADDITEMS" else "set"
            target = stack[-1]
            ok = (isinstance(target, _Container) and target.kind == kind) or (
                isinstance(target, _Made) and _adds_plainly(target.cls, kind))
            if not ok:
                who = target.name if isinstance(target, _Global) else (
                    canonical(target.cls) if isinstance(target, _Made) and target.cls is not None else "(pickle)")
                raise Unsafe(who, f"the file adds items ({code}) to an object that is not a {kind} it built "
                                  f"(that would call its methods)")
        elif code == "GLOBAL":
            module, name = arg.split(" ", 1)
            stack.append(glob(f"{module}.{name}"))
        elif code == "STACK_GLOBAL":
            name_v, module_v = stack.pop(), stack.pop()
            if not (isinstance(name_v, tuple) and isinstance(module_v, tuple)
                    and isinstance(name_v[1], str) and isinstance(module_v[1], str)):
                raise Unsafe("(pickle)", "it names a global by a value it computed")
            stack.append(glob(f"{module_v[1]}.{name_v[1]}"))
        elif code == "REDUCE":
            args = stack.pop()
            fn = stack.pop()
            stack.append(call(fn, args, "REDUCE"))
        elif code in ("NEWOBJ", "NEWOBJ_EX"):
            if code == "NEWOBJ_EX":
                stack.pop()
            args = stack.pop()
            cls = stack.pop()
            stack.append(call(cls, args, "builds with __new__"))
        elif code == "OBJ":
            items = pop_mark()
            if not items:
                raise Unsafe("(pickle)", "its opcodes are malformed (OBJ without a class)")
            stack.append(call(items[0], _Tuple(items[1:]), "OBJ"))
        elif code == "INST":
            module, name = arg.split(" ", 1)
            items = pop_mark()
            stack.append(call(glob(f"{module}.{name}"), _Tuple(items), "INST"))
        elif code == "BUILD":
            stack.pop()
            target = stack[-1]
            if isinstance(target, _Global):
                raise Unsafe(target.name, "the file sets attributes of this class or function itself (BUILD), "
                                          "which would change it for the whole process")
            if not isinstance(target, (_Made, _Container, _Tuple)):
                raise Unsafe("(pickle)", "the file sets the state (BUILD) of a value that is not an object it built")
        elif code in ("PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4", "NEXT_BUFFER"):
            raise Unsafe("(pickle)", f"it uses {code}, which gn.save never writes")
        else:
            raise Unsafe("(pickle)", f"it uses the opcode {code}, which gn.save never writes")


def _builds_data_when_called(cls: type) -> bool:
    """Classes a pickle may call (``cls(*args)``): builtin data types, NumPy's dtypes and random generators,
    and compiled (Cython) classes of scikit-learn, whose constructors build their data structure."""
    real = canonical(cls)
    if real.startswith("builtins.") or real in PICKLE_HELPERS:
        return real in PICKLE_HELPERS
    if issubclass(cls, np.dtype) or real.startswith("numpy.random."):
        return True
    if real.startswith("sklearn."):   # a compiled class (not a heap type: no Python code of its own)
        return not cls.__flags__ & _HEAPTYPE and not any(
            isinstance(b.__dict__.get("__init__"), types.FunctionType) for b in cls.__mro__)
    return False


_HEAPTYPE = 1 << 9   # Py_TPFLAGS_HEAPTYPE: set on classes defined in Python


# ----------------------------------------------------------------- skops: the schema, not run


def check_skops(payload: bytes, named: Iterable[str]) -> None:
    """Check a skops payload's schema without building it: raise :class:`Unsafe` naming the culprit."""
    named = set(named)
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as zf:
            schema = json.loads(zf.read("schema.json"))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError):
        return   # not readable: skops' own reading reports the damage
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        todo.extend(node.values())
        loader, module, cls = node.get("__loader__"), node.get("__module__"), node.get("__class__")
        if not isinstance(loader, str) or not isinstance(module, str) or not isinstance(cls, str):
            continue
        name = f"{module}.{cls}"
        why = never_reason(name)
        if why is not None:
            raise Unsafe(name, f"it is never loaded: {why}")
        if module.split(".")[0] in _LOOKED_UP and loader in ("FunctionNode", "TypeNode", "ObjectNode",
                                                              "ConstructorFromReduceNode"):
            obj = resolve(name)   # judged as what it refers to (numpy.savez is numpy.lib._npyio_impl.savez)
            why = never_reason(canonical(obj)) if obj is not None else None
            if why is not None:
                raise Unsafe(name, f"it is {canonical(obj)}, which is never loaded: {why}")
        if loader == "MethodNode":
            func = (node.get("content") or {}).get("func") if isinstance(node.get("content"), dict) else None
            full = f"{name}.{func}"
            if full not in named:
                raise Unsafe(full, "the file looks up a method by a name it holds (gn.save never writes one)")
        elif loader == "OperatorFuncNode":
            raise Unsafe(f"operator.{cls}", "the file builds an operator object that reads or calls by name")
        elif loader == "ConstructorFromReduceNode" and name not in named:
            plain = ("builtins", "datetime", "zoneinfo", "decimal", "fractions")
            obj = resolve(name) if module.split(".")[0] in plain else None
            if not (isinstance(obj, type) and canonical(obj).split(".")[0] in plain):
                raise Unsafe(name, "the file calls this class or function while it loads; gn.load never calls "
                                   "a trusted function, or a class's constructor, while loading a file")


# ----------------------------------------------------------------- the built graph, not run


def _bound(x: Any) -> bool:
    """A bound method (a builtin function's ``__self__`` is its module: not bound)."""
    return isinstance(x, types.MethodType) or (isinstance(x, types.BuiltinMethodType)
                                               and not isinstance(getattr(x, "__self__", None), types.ModuleType)
                                               and getattr(x, "__self__", None) is not None)


def _is_code(x: Any) -> bool:
    return isinstance(x, (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                          types.BuiltinMethodType, functools.partial))


def _fn_name(fn: Any) -> str:
    return canonical(fn)


class _Walk:
    """Every object of the archive, visited once; operations of nodes are checked where they are."""

    def __init__(self, named: set[str]) -> None:
        self.named = named
        self.seen: set[int] = set()
        self.todo: list[Any] = []

    def value(self, x: Any) -> None:
        self.todo.append(x)

    def run(self) -> None:
        while self.todo:
            x = self.todo.pop()
            if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
                continue
            if _is_code(x):
                self.code_value(x)
                continue
            if id(x) in self.seen:
                continue
            self.seen.add(id(x))
            self.visit(x)

    def code_value(self, x: Any) -> None:
        """A function or partial found as a value (not a node's operation): it must not dispatch."""
        if isinstance(x, functools.partial):
            if id(x) in self.seen:
                return
            self.seen.add(id(x))
            self.todo.extend((x.func, *x.args, *x.keywords.values()))
            self.todo.extend(getattr(x, "__dict__", {}).values())
            return
        if _bound(x):
            raise Unsafe(f"{_fn_name(x)}", "a bound method: gn.save never writes one")
        if is_dispatching(x) and _fn_name(x) not in self.named:
            raise Unsafe(_fn_name(x), "it calls what its arguments name, so it may only be a node's operation "
                                      "(whose arguments gn.load checks), never a value handed to another function")

    def visit(self, x: Any) -> None:
        if isinstance(x, types.ModuleType):
            raise Unsafe(x.__name__, "a module is never part of a saved network")
        if isinstance(x, np.ndarray):
            if x.dtype.hasobject:
                self.todo.extend(x.ravel().tolist())
            return
        if isinstance(x, type):
            return
        if isinstance(x, Record):
            self.record(x)
            return
        if isinstance(x, Items):
            for k, v in x.pairs:
                self.todo.extend((k, v))
            return
        if isinstance(x, Archive):
            self.todo.append(x.root)
            self.todo.extend(x.table)
            return
        if isinstance(x, dict):
            self.todo.extend(x.keys())
            self.todo.extend(x.values())
            self.todo.append(getattr(x, "default_factory", None))   # a defaultdict calls it
        elif isinstance(x, (list, tuple, set, frozenset)):
            self.todo.extend(x)
        _check_scorer(x)
        d = getattr(x, "__dict__", None)
        if isinstance(d, dict):
            self.todo.extend(d.values())
        for cls in type(x).__mro__:
            slots = cls.__dict__.get("__slots__", ())
            for s in (slots,) if isinstance(slots, str) else slots:
                if s not in ("__dict__", "__weakref__") and hasattr(x, s):
                    self.todo.append(getattr(x, s))

    def record(self, rec: Record) -> None:
        fields = rec.fields if isinstance(rec.fields, dict) else {}
        if rec.kind == "node" and isinstance(fields.get("attrs"), dict):
            attrs = dict(fields["attrs"])
            op = attrs.pop("operation", None)
            args = attrs.get("_args", ())
            if attrs.get("machine") is None:   # a machine's operation is a name: the decoder checks it is one
                self.operation(op, tuple(args) if isinstance(args, (tuple, list)) else ())
            self.todo.extend(attrs.values())
            return
        self.todo.extend(fields.values())

    def operation(self, op: Any, node_args: tuple[Any, ...]) -> None:
        """A node's operation: a dispatching function here gets its checked arguments checked."""
        prefix: list[Any] = []
        keywords: dict[str, Any] = {}
        fn = op
        while isinstance(fn, functools.partial):
            self.todo.extend(fn.args)
            self.todo.extend(fn.keywords.values())
            self.todo.extend(getattr(fn, "__dict__", {}).values())
            prefix[:0] = list(fn.args)
            keywords = {**fn.keywords, **keywords}
            fn = fn.func
        if isinstance(fn, type) and canonical(fn) not in self.named:
            raise Unsafe(canonical(fn), "a class as a node's operation: its constructor would run when the network "
                                        "is called (gpunets' networks never use one); trust it by name with "
                                        "trusted=[...] if the file is yours")
        if not is_dispatching(fn) or _fn_name(fn) in self.named:
            self.todo.append(fn)
            return
        args = (*prefix, *node_args)
        try:
            names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            names = []
        for pos, kind in sorted(checked_arguments(fn).items()):
            by_name = names[pos] if pos < len(names) else None
            if by_name in keywords:   # given by keyword (a partial's)
                _check_argument(_fn_name(fn), pos, kind, keywords[by_name], self.named)
            if pos < len(args):
                _check_argument(_fn_name(fn), pos, kind, args[pos], self.named)


def _check_argument(fname: str, pos: int, kind: str, value: Any, named: set[str]) -> None:
    culprit = f"{fname} (argument {pos}, {value!r:.80})"
    if isinstance(value, Ref):
        raise Unsafe(culprit, f"its {kind} argument is computed by another node; a loaded file must write it")
    if kind == "operation":
        ok = isinstance(value, str) and value in OPERATIONS
        want = f"one of {list(OPERATIONS)}"
    elif kind == "operations":
        ok = isinstance(value, (tuple, list)) and all(isinstance(v, str) and v in OPERATIONS for v in value)
        want = f"a tuple of {list(OPERATIONS)}"
    elif kind == "kernel":
        ok = isinstance(value, str) and value in KERNELS
        want = f"one of {list(KERNELS)}"
    elif kind == "parameter":
        ok = isinstance(value, str) and value.isidentifier() and not value.startswith("_") and not keyword.iskeyword(
            value)
        want = "a public parameter name"
    else:   # callable
        ok = not isinstance(value, type) and not (_is_code(value) and _dispatches(value, named))
        want = "a trusted function or callable object that does not itself call what its arguments name"
    if not ok:
        raise Unsafe(culprit, f"it calls what this argument names, which must be {want}")


def _dispatches(fn: Any, named: set[str]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return _bound(fn) or (is_dispatching(fn) and _fn_name(fn) not in named)


def _check_scorer(x: Any) -> None:
    """A scikit-learn scorer calls its estimator's ``response_method`` by name: it must be an operation."""
    method = getattr(x, "_response_method", None) if type(x).__module__.startswith("sklearn.metrics") else None
    if method is None:
        return
    methods = (method,) if isinstance(method, str) else method
    if not isinstance(methods, (tuple, list)) or not all(isinstance(m, str) and m in OPERATIONS for m in methods):
        raise Unsafe(f"{canonical(type(x))} (response_method={method!r:.80})",
                     f"a scorer calls its estimator's method by this name, which must be one of {list(OPERATIONS)}")


def check_archive(archive: Archive, named: Iterable[str]) -> None:
    """Check the built graph of a file before it is rebuilt or run: raise :class:`Unsafe` naming the culprit."""
    walk = _Walk(set(named))
    walk.value(archive)
    walk.run()
