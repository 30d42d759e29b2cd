"""Saving and loading fitted networks and composites, without their training data.

:func:`save` writes a node (with every machine upstream of it and their
fitted states), a machine, a fitted composite or stack, or any estimator
holding them, to one file; :func:`load` reads it back.  As MLJ's
``serializable`` does, the file never holds training data: sources keep their
name (so the loaded network can be called on new data, ``yhat(Xnew)``) but not
their data, and nothing a fit kept of them (a composite's own copy of ``X``,
fingerprints, traces) is written.

Values on a GPU (CuPy arrays in fitted states, cuDF objects, fitted cuML
estimators, which are stored as their scikit-learn twins) are copied to the
host when saved.  When loaded they go back to the device they were on where
that device exists here; elsewhere they stay on the host and the machines
run on the CPU, with the usual :class:`~gpunets.DeviceFallbackWarning` (or
the error ``gn.config(fallback="raise")`` asks for).

The file is a zip archive: ``gpunets.json`` (the gpunets version, the format
and its version, read before anything else) and the payload, written with
:mod:`pickle` (``format="pickle"``, the default) or with ``skops.io``
(``format="skops"``, needs ``pip install "gpunets[persist]"``).

.. warning::
   Loading a pickle runs code chosen by whoever wrote the file.  Load pickle
   files only from sources you trust; for files from elsewhere use
   ``format="skops"``, which loads only types on a trusted list (gpunets'
   own, NumPy's, scikit-learn's, and those you name with ``trusted=[...]``).

The graph is written as a table (one entry per source, node and machine,
referred to by index), so shared parts are written once and deep networks need
no deep recursion.

>>> import os, tempfile, numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge
>>> X, y = gn.source(np.eye(3), name="X"), gn.source(np.arange(3.0), name="y")
>>> yhat = gn.machine(Ridge(), X, y).predict(X)
>>> _ = yhat.fit()
>>> path = os.path.join(tempfile.mkdtemp(), "ridge.gn")
>>> _ = gn.save(yhat, path)
>>> loaded = gn.load(path)
>>> np.allclose(loaded(np.eye(3)), yhat())
True
>>> loaded.origins[0].data is None
True
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import io
from importlib import metadata
import json
import os
import pickle
import platform
import re
import types
import zipfile
from typing import Any, Iterable, Sequence

import numpy as np
import sklearn

from . import __version__
from .composite import Composite, NetworkState
from .data import device_of, is_cudf, is_cupy_array, to_device
from .devices import CPU, Device, check_available, local_ordinal
from .exceptions import GpunetsError
from .executors import Executor, SerialExecutor, StreamsExecutor, ThreadsExecutor
from .machines import OPERATIONS, FittedState, Machine
from .models import _fall_back, cuml_installed, cuml_twin_class, is_cuml_estimator
from ._gpulibs import loaded_cupy
from .config import get_config
from .nodes import AbstractNode, Node, Source, mark_data_not_saved
from .report import ActionMap, FitReport
from .trace import Trace

__all__ = ["save", "load", "FORMATS", "FORMAT_VERSION", "TRUSTED_TYPES", "PersistenceError", "UntrustedTypesError"]

#: The file formats :func:`save` writes.
FORMATS = ("pickle", "skops")

#: The version of the file layout; a file with another one is refused with both versions named.
FORMAT_VERSION = 1

_META = "gpunets.json"
_PAYLOAD = {"pickle": "payload.pkl", "skops": "payload.skops"}
_MAGIC = "gpunets.save"

#: Types and functions of gpunets (and of the Python library, for the node arithmetic) that the skops format
#: loads without being named in ``trusted=``: plain data holders and the operations gpunets' own nodes use.
TRUSTED_TYPES: tuple[str, ...] = (
    "gpunets.persist._Archive", "gpunets.persist._Ref", "gpunets.persist._Record", "gpunets.persist._Items",
    "gpunets.persist._HostValue",
    "gpunets.devices.Device",
    "gpunets.stacking.StackingRegressor", "gpunets.stacking.StackingClassifier",
    "gpunets.ops.combine",
    "gpunets.stacking.take_rows", "gpunets.stacking.assemble_folds", "gpunets.stacking.enforce_order",
    "gpunets.stacking.concat_predictions", "gpunets.stacking.decode_labels",
    "functools.partial",
    "sklearn.utils._bunch.Bunch",
    *(f"_operator.{op}" for op in ("add", "sub", "mul", "truediv", "pow", "matmul", "neg", "abs", "getitem")),
    # scikit-learn's cross-validation splitters (a stack's cv=): plain parameter holders, like its estimators
    *(f"sklearn.model_selection._split.{name}" for name in (
        "KFold", "StratifiedKFold", "GroupKFold", "StratifiedGroupKFold", "RepeatedKFold", "RepeatedStratifiedKFold",
        "ShuffleSplit", "StratifiedShuffleSplit", "GroupShuffleSplit", "TimeSeriesSplit", "PredefinedSplit",
        "LeaveOneOut", "LeavePOut", "LeaveOneGroupOut", "LeavePGroupsOut")),
)

# Executors are saved as what they were made from; a Dask executor as the name "dask" (its client stays behind).
_EXECUTORS: dict[str, type[Executor]] = {"serial": SerialExecutor, "threads": ThreadsExecutor,
                                         "streams": StreamsExecutor}


class PersistenceError(GpunetsError, ValueError):
    """A file cannot be loaded: not written by :func:`gpunets.save`, or by an incompatible gpunets version."""


class UntrustedTypesError(GpunetsError, TypeError):
    """A ``format="skops"`` file holds types that are not trusted (name them in ``trusted=[...]``)."""


# ----------------------------------------------------------------- what the payload is made of


class _Ref:
    """A reference to entry ``i`` of the archive's table (a source, node or machine)."""

    def __init__(self, i: int) -> None:
        self.i = i


class _Record:
    """A gpunets object written field by field (``kind``: source, node, machine, state, network, report)."""

    def __init__(self, kind: str, fields: dict[str, Any]) -> None:
        self.kind = kind
        self.fields = fields


class _Items:
    """A dict whose keys are not strings or numbers (e.g. machines), as a list of pairs."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs


class _HostValue:
    """A value that lived on a GPU, copied to the host, and the device it goes back to when loaded."""

    def __init__(self, value: Any, device: str) -> None:
        self.value = value
        self.device = device


class _Archive:
    """The payload: the object saved (with references into the table) and the table of graph objects."""

    def __init__(self, root: Any, table: list[_Record]) -> None:
        self.root = root
        self.table = table


_SCALARS = (bool, int, float, complex, str, bytes)
_CODE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type,
         functools.partial)


def _is_leaf(x: Any) -> bool:
    """Values written as they are, never looked into: arrays, frames, sparse matrices, functions, types."""
    if isinstance(x, (np.ndarray, np.generic, Device) + _CODE):
        return True
    return type(x).__module__.split(".")[0] in ("pandas", "scipy", "numpy")


def _attrs(obj: Any) -> dict[str, Any]:
    """Every attribute of ``obj``: its slots (in class order) and its ``__dict__``."""
    out: dict[str, Any] = {}
    for cls in reversed(type(obj).__mro__):
        slots = cls.__dict__.get("__slots__", ())
        for s in (slots,) if isinstance(slots, str) else slots:
            if s not in ("__weakref__", "__dict__") and hasattr(obj, s):
                out[s] = getattr(obj, s)
    out.update(getattr(obj, "__dict__", {}))
    return out


def _function_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', repr(fn)))}"


def _importable(fn: Any) -> bool:
    """Whether ``fn`` can be found again by its module and name (what pickle and skops store of it)."""
    if isinstance(fn, functools.partial):
        return _importable(fn.func)
    if not isinstance(fn, (types.FunctionType, types.BuiltinFunctionType)):
        return True   # a callable object: written with its state
    qual = getattr(fn, "__qualname__", "")
    if "<lambda>" in qual or "<locals>" in qual:
        return False
    try:
        obj: Any = importlib.import_module(fn.__module__)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except Exception:
        return False
    return obj is fn


# ----------------------------------------------------------------- saving


class _Encoder:
    """Turns the object saved into an :class:`_Archive`, leaving the live objects untouched.

    Sources, nodes and machines become table entries (without training data); GPU values are copied to the
    host; anything else that holds them is copied shallowly with its attributes encoded.
    """

    def __init__(self) -> None:
        self.table: list[Any] = []
        self.index: dict[int, int] = {}
        self.pending: list[tuple[int, Any]] = []
        self.memo: dict[int, Any] = {}
        self.visiting: set[int] = set()
        self.keep: list[Any] = []     # the originals stay alive while their ids key the memo
        self.devices: set[str] = set()

    def run(self, root: Any) -> _Archive:
        enc = self.value(root)
        while self.pending:
            i, obj = self.pending.pop()
            self.table[i] = self.record(obj)
        return _Archive(enc, self.table)

    def ref(self, obj: Any) -> _Ref:
        i = self.index.get(id(obj))
        if i is None:
            i = self.index[id(obj)] = len(self.table)
            self.table.append(None)
            self.pending.append((i, obj))
            self.keep.append(obj)
        return _Ref(i)

    # --- graph objects: one table entry each
    def record(self, obj: Any) -> _Record:
        attrs = _attrs(obj)
        attrs.pop("_uid", None)
        if isinstance(obj, Source):
            return _Record("source", {"name": obj.name})
        if isinstance(obj, Node):
            attrs.pop("_cost", None)   # measured durations: measured again
            op = attrs.get("operation")
            if callable(op) and not _importable(op):
                msg = (f"Cannot save node {obj._short()!r}: its operation {_function_name(op)} is a lambda or a "
                       f"function defined inside another function, which neither pickle nor skops can store "
                       f"(they store functions by module and name). Define it with def at the top level of a "
                       f"module, then build the node again.")
                raise TypeError(msg)
            return _Record("node", {"class": type(obj).__name__, "attrs": self.value(attrs)})
        return _Record("machine", {"class": type(obj).__name__, "attrs": self.value(attrs)})

    # --- everything else
    def value(self, x: Any) -> Any:
        if x is None or isinstance(x, _SCALARS):
            return x
        if isinstance(x, (AbstractNode, Machine)):
            return self.ref(x)
        key = id(x)
        if key in self.memo:
            return self.memo[key]
        if key in self.visiting:   # a cycle outside the graph: keep the object as it is
            return x
        self.visiting.add(key)
        self.keep.append(x)
        try:
            out = self._encode(x)
        finally:
            self.visiting.discard(key)
        self.memo[key] = out
        return out

    def _encode(self, x: Any) -> Any:
        if is_cupy_array(x) or is_cudf(x):
            dev = str(device_of(x))
            self.devices.add(dev)
            return _HostValue(to_device(x, CPU), dev)
        if isinstance(x, FittedState):
            return self.state(x)
        if isinstance(x, NetworkState):
            return self.network(x)
        if isinstance(x, FitReport):
            return self.report(x)
        if isinstance(x, Executor):
            name = x.name if type(x) is _EXECUTORS.get(x.name) else "dask" if x.name == "dask" else None
            if name is None:
                msg = (f"Cannot save the executor {x!r} (a {type(x).__name__}): gn.save stores gpunets' own "
                       f"executors only. Set the parameter to its name (e.g. executor='threads') before saving.")
                raise TypeError(msg)
            args = x._constructor_args(for_pickle=True) if name != "dask" else {}
            return _Record("executor", {"name": name, "args": self.value(args)})
        if _is_leaf(x):
            return x
        if type(x) in (list, tuple, set, frozenset):
            items = [self.value(v) for v in x]
            return x if all(a is b for a, b in zip(items, x)) else type(x)(items)
        if isinstance(x, tuple) and hasattr(x, "_fields"):   # a namedtuple
            items = [self.value(v) for v in x]
            return x if all(a is b for a, b in zip(items, x)) else type(x)._make(items)  # type: ignore[attr-defined]
        if type(x) is dict:
            return self.mapping(x)
        return self.obj(x)

    def mapping(self, d: dict[Any, Any]) -> Any:
        plain = all(type(k) in (str, int) for k in d)
        if plain:
            enc = {k: self.value(v) for k, v in d.items()}
            return d if all(enc[k] is d[k] for k in d) else enc
        return _Items([(self.value(k), self.value(v)) for k, v in d.items()])

    def obj(self, x: Any) -> Any:
        attrs = getattr(x, "__dict__", None)
        items = dict(x) if isinstance(x, dict) else None
        if not isinstance(attrs, dict) and items is None:
            return x
        enc_attrs = {k: self.value(v) for k, v in (attrs or {}).items()}
        enc_items = {k: self.value(v) for k, v in (items or {}).items()}
        if all(enc_attrs[k] is v for k, v in (attrs or {}).items()) and all(
                enc_items[k] is v for k, v in (items or {}).items()):
            return x
        cp = copy.copy(x)
        if enc_attrs:
            cp.__dict__.update(enc_attrs)
        if items is not None:
            cp.clear()
            cp.update(enc_items)
        return cp

    def state(self, st: FittedState) -> _Record:
        fields = {f.name: getattr(st, f.name) for f in dataclasses.fields(st)}
        est = fields["estimator"]
        converted = ""
        if st.path == "cuml" and is_cuml_estimator(est):
            est, converted = est.as_sklearn(), "cuml"   # cuML's own interop: the fitted scikit-learn twin
            self.devices.add(st.device)
        # what a fit recorded of its training data is not kept: the next fit of a loaded network always trains
        fields.update(estimator=est, params={}, upstream=b"")
        return _Record("state", {"fields": self.value(fields), "converted": converted})

    def network(self, ns: NetworkState) -> _Record:
        return _Record("network", {
            "sources": self.value(dict(ns.sources)), "outputs": self.value(dict(ns.outputs)),
            "machines": self.value(tuple(ns.machines)),
            "names": [ns.names.get(id(m)) for m in ns.machines],   # keyed by id(): rebuilt when loaded
        })

    def report(self, r: FitReport) -> _Record:
        attrs = {k: v for k, v in vars(r).items() if k not in ("trace", "actions", "_fit_tasks")}
        return _Record("report", {"attrs": self.value(attrs), "actions": self.value(dict(r.actions)),
                                  "trace_executor": getattr(r.trace, "executor", r.executor)})


def _check_target(obj: Any) -> None:
    def ok(x: Any) -> bool:
        if isinstance(x, (AbstractNode, Machine)) or callable(getattr(x, "fit", None)):
            return not isinstance(x, type)
        if isinstance(x, (list, tuple)):
            return len(x) > 0 and all(ok(v) for v in x)
        if isinstance(x, dict):
            return len(x) > 0 and all(ok(v) for v in x.values())
        return False

    if not ok(obj):
        msg = (f"gn.save saves a node, a machine, a composite or another estimator (or a list or dict of them); "
               f"got {obj!r} of type {type(obj).__name__}. Hint: gn.save(yhat, path) with yhat = mach.predict(X).")
        raise TypeError(msg)


def _skops_io() -> Any:
    try:
        import skops.io as sio  # lazy: skops is an optional extra, imported only for format="skops"
    except ImportError as exc:
        msg = ('format="skops" needs the skops package: pip install "gpunets[persist]" (or pip install skops); '
               'or use format="pickle" for files you will only load yourself.')
        raise ImportError(msg) from exc
    return sio


def _versions() -> dict[str, Any]:
    try:
        sk: str | None = metadata.version("skops")   # read from the metadata: skops stays unimported
    except metadata.PackageNotFoundError:
        sk = None
    return {"gpunets": __version__, "python": platform.python_version(), "numpy": np.__version__,
            "sklearn": sklearn.__version__, "skops": sk}


def save(obj: Any, path: str | os.PathLike[str], *, format: str = "pickle") -> str:  # noqa: A002 - the word users know
    """Save a fitted network, machine or composite to ``path``, without its training data.

    Parameters
    ----------
    obj : node, machine, estimator, or a list or dict of them
        A node is saved with every machine upstream of it and their fitted
        states; a composite or stack (or any estimator holding one) with its
        fitted network.  Objects saved together share their machines.
    path : str or path-like
        The file to write (replaced if it exists).
    format : {"pickle", "skops"}, default "pickle"
        ``"pickle"`` stores anything picklable, but loading it runs code:
        only load pickle files you trust.  ``"skops"`` (needs the ``skops``
        package) writes a file that :func:`load` checks against a list of
        trusted types before building anything: use it for files you share.

    Returns
    -------
    str
        The path written.

    Raises
    ------
    ValueError
        For an unknown ``format``.
    TypeError
        For an object that is not a node, machine or estimator, or a node whose operation is a lambda or a
        local function (pickle and skops store functions by name).
    ImportError
        For ``format="skops"`` where skops is not installed.

    Examples
    --------
    >>> import os, tempfile, numpy as np, gpunets as gn
    >>> from sklearn.linear_model import Ridge
    >>> X = gn.source(np.eye(3), name="X")
    >>> mach = gn.machine(Ridge(), X, gn.source(np.ones(3), name="y"))
    >>> _ = mach.fit()
    >>> gn.save(mach.predict(X), os.path.join(tempfile.mkdtemp(), "m.gn"), format="json")
    Traceback (most recent call last):
    ...
    ValueError: gn.save: format='json' is not a format; use 'pickle' or 'skops'...
    """
    if format not in FORMATS:
        msg = (f"gn.save: format={format!r} is not a format; use 'pickle' or 'skops' (skops for files others "
               f"will load: loading a pickle runs code).")
        raise ValueError(msg)
    _check_target(obj)
    sio = _skops_io() if format == "skops" else None
    enc = _Encoder()
    archive = enc.run(obj)
    if sio is not None:
        try:
            payload = sio.dumps(archive)
        except TypeError as exc:
            msg = (f"gn.save(format='skops') cannot store this object: {exc} Use format='pickle' for objects "
                   f"skops does not support (and only load that file where you trust it).")
            raise TypeError(msg) from exc
    else:
        payload = pickle.dumps(archive, protocol=pickle.HIGHEST_PROTOCOL)
    meta = {"magic": _MAGIC, "format": format, "format_version": FORMAT_VERSION, "object": type(obj).__name__,
            "devices": sorted(enc.devices), **_versions()}
    path = os.fspath(path)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(_META, json.dumps(meta, indent=1))
        zf.writestr(_PAYLOAD[format], payload)
    partial = f"{path}.partial-{os.getpid()}"   # written whole, then renamed: a failed write leaves `path` as it was
    try:
        with open(partial, "wb") as f:
            f.write(buf.getvalue())
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


# ----------------------------------------------------------------- loading


def _series(version: str) -> tuple[str, ...]:
    m = re.match(r"^(\d+)\.(\d+)", version)
    return m.groups() if m else (version,)


def _read_meta(zf: zipfile.ZipFile, path: str) -> dict[str, Any]:
    try:
        meta = json.loads(zf.read(_META))
    except (KeyError, ValueError) as exc:
        msg = f"{path!r} was not written by gn.save (it has no readable {_META}); gn.load reads only gn.save's files."
        raise PersistenceError(msg) from exc
    if not isinstance(meta, dict) or meta.get("magic") != _MAGIC:
        msg = f"{path!r} was not written by gn.save ({_META} is not gpunets'); gn.load reads only gn.save's files."
        raise PersistenceError(msg)
    theirs, fv = str(meta.get("gpunets", "?")), meta.get("format_version")
    if fv != FORMAT_VERSION or _series(theirs) != _series(__version__):
        msg = (f"{path!r} was written by gpunets {theirs} (file format {fv}); this is gpunets {__version__} "
               f"(file format {FORMAT_VERSION}), which loads only files written by gpunets "
               f"{'.'.join(_series(__version__))}.x. Load it with gpunets {theirs}, or fit the network again "
               f"with this version and save it anew.")
        raise PersistenceError(msg)
    if meta.get("format") not in FORMATS or _PAYLOAD[meta["format"]] not in zf.namelist():
        msg = f"{path!r}: the file is damaged (format {meta.get('format')!r} without its payload)."
        raise PersistenceError(msg)
    return meta


def _type_names(trusted: Iterable[Any]) -> list[str]:
    out = []
    for t in trusted:
        if isinstance(t, str):
            out.append(t)
        elif hasattr(t, "__module__") and hasattr(t, "__name__"):
            out.append(f"{t.__module__}.{t.__name__}")
        else:
            msg = f"gn.load: trusted= takes type names or types; got {t!r} of type {type(t).__name__}."
            raise TypeError(msg)
    return out


def _load_skops(payload: bytes, trusted: Sequence[Any] | None, path: str) -> Any:
    sio = _skops_io()
    allowed = list(TRUSTED_TYPES) + _type_names(trusted or ())
    untrusted = sorted(set(sio.get_untrusted_types(data=payload)) - set(allowed))
    if untrusted:
        from skops.io.exceptions import UNTRUSTED_TYPE_REASONS  # lazy: skops is optional

        notes = "".join(f"\n- {UNTRUSTED_TYPE_REASONS[t]}" for t in untrusted if t in UNTRUSTED_TYPE_REASONS)
        msg = (f"gn.load: {path!r} holds types that are not trusted: {untrusted}. Loading a type can run its "
               f"code, so gn.load builds nothing until you trust them: if you trust where the file comes from and "
               f"these types, load it with gn.load(path, trusted={untrusted!r}).{notes}")
        raise UntrustedTypesError(msg)
    return sio.loads(payload, trusted=allowed)


def _graph_classes() -> dict[str, type]:
    """gpunets' node and machine classes by name (the table names them; nothing else is built from it)."""
    out: dict[str, type] = {}
    todo: list[type] = [Node, Machine]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("gpunets."):
            out.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return out


class _Decoder:
    """Rebuilds the saved object from an :class:`_Archive`: graph objects with new identities, GPU values moved
    back to their device where it exists here (else kept on the host, with the fallback policy's warning)."""

    def __init__(self, archive: _Archive, path: str) -> None:
        self.archive = archive
        self.path = path
        self.objects: list[Any] = []
        self.memo: dict[int, Any] = {}
        self.targets: dict[str, Device] = {}
        self.composites: list[Composite] = []
        self.converted = False    # a fitted cuML estimator was rebuilt from its scikit-learn twin

    def run(self) -> Any:
        classes = _graph_classes()
        for rec in self.archive.table:
            cls: Any = Source if rec.kind == "source" else classes.get(str(rec.fields.get("class")))
            if cls is None or rec.kind not in ("source", "node", "machine"):
                msg = f"{self.path!r}: the file is damaged (an unknown graph entry {rec.kind!r})."
                raise PersistenceError(msg)
            self.objects.append(cls.__new__(cls))
        for obj, rec in zip(self.objects, self.archive.table):
            if rec.kind == "source":
                obj.__setstate__((None, {"name": rec.fields["name"], "_data": None, "_version": 0}))
                mark_data_not_saved(obj)
            elif rec.kind == "node":
                attrs = self.value(rec.fields["attrs"])
                if attrs.get("machine") is not None and attrs.get("operation") not in OPERATIONS:
                    msg = (f"{self.path!r}: the file is damaged (a machine operation {attrs.get('operation')!r}; "
                           f"operations are {list(OPERATIONS)}).")
                    raise PersistenceError(msg)
                obj.__setstate__((None, attrs))
            else:
                obj.__setstate__(self.value(rec.fields["attrs"]))
        root = self.value(self.archive.root)
        if self.converted:   # fitted attributes naming the network's estimators (a stack's estimators_)
            for comp in self.composites:
                comp._gn_after_fit(comp._gn_state)
        return root

    def target(self, dev: str) -> Device:
        """Where values saved on ``dev`` go: there if it exists here, else the CPU (warned once per load)."""
        if dev not in self.targets:
            what = f"the network loaded from {os.path.basename(self.path)!r} (fitted on {dev})"
            self.targets[dev] = check_available(dev, what=what)
        return self.targets[dev]

    def value(self, x: Any) -> Any:
        if x is None or isinstance(x, _SCALARS):
            return x
        if isinstance(x, _Ref):
            return self.objects[x.i]
        key = id(x)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = x    # cycles and repeats: visited once
        out = self._decode(x)
        self.memo[key] = out
        return out

    def _decode(self, x: Any) -> Any:
        if isinstance(x, _HostValue):
            dev = self.target(x.device)
            if dev.is_cpu:
                return x.value
            try:
                return to_device(x.value, dev)
            except ImportError:   # a cuDF frame where cuDF is not installed: it stays a pandas frame
                return x.value
        if isinstance(x, _Record):
            if x.kind not in ("state", "network", "report", "executor"):
                msg = f"{self.path!r}: the file is damaged (an unknown record {x.kind!r})."
                raise PersistenceError(msg)
            return getattr(self, f"_{x.kind}")(x.fields)
        if isinstance(x, _Items):
            return {self.value(k): self.value(v) for k, v in x.pairs}
        if _is_leaf(x):
            return x
        if type(x) in (tuple, frozenset, set) or (isinstance(x, tuple) and hasattr(x, "_fields")):
            items = [self.value(v) for v in x]
            if all(a is b for a, b in zip(items, x)):
                return x
            return type(x)._make(items) if hasattr(x, "_fields") else type(x)(items)
        if isinstance(x, list):
            x[:] = [self.value(v) for v in x]
            return x
        if isinstance(x, dict):
            for k, v in list(x.items()):
                x[k] = self.value(v)
        attrs = getattr(x, "__dict__", None)
        if isinstance(attrs, dict):
            for k, v in list(attrs.items()):
                attrs[k] = self.value(v)
        if isinstance(x, Composite) and isinstance(getattr(x, "_gn_state", None), NetworkState):
            self.composites.append(x)
        return x

    # --- records
    def _state(self, fields: dict[str, Any]) -> FittedState:
        saved = self.value(fields["fields"])
        converted = fields.get("converted", "")
        dev, path, est = saved["device"], saved["path"], saved["estimator"]
        if path in ("array_api", "cuml") and str(dev).startswith("cuda"):
            target = self.target(str(dev))
            if target.is_cpu:
                dev, path = "cpu", "cpu_fallback"
            elif converted == "cuml":
                est, dev, path = self._to_cuml(est, target)
                self.converted = True
        saved.update(estimator=est, device=str(dev), path=path)
        return FittedState(**saved)

    def _to_cuml(self, est: Any, target: Device) -> tuple[Any, str, str]:
        twin = cuml_twin_class(est) if cuml_installed() else None
        if twin is None or not hasattr(twin, "from_sklearn"):
            reason = "cuML is not installed" if not cuml_installed() else f"cuML has no twin of {type(est).__name__}"
            _fall_back(est, target, f"{reason}, so the loaded {type(est).__name__} runs on the CPU",
                       what=f"the network loaded from {os.path.basename(self.path)!r}",
                       policy=get_config()["fallback"])
            return est, "cpu", "cpu_fallback"
        cp = loaded_cupy()
        if cp is not None:
            with cp.cuda.Device(local_ordinal(target.index or 0)):
                gpu = twin.from_sklearn(est)
        else:
            gpu = twin.from_sklearn(est)
        # from_sklearn sets output_type="numpy"; cuML's default mirrors the input, as models.to_cuml restores
        if getattr(gpu, "output_type", None) == "numpy" and "output_type" in gpu.get_params(deep=False):
            gpu.set_params(output_type="input")
        return gpu, str(target), "cuml"

    def _executor(self, fields: dict[str, Any]) -> Any:
        cls = _EXECUTORS.get(fields["name"])
        return cls(**self.value(fields["args"])) if cls is not None else "dask"

    def _network(self, fields: dict[str, Any]) -> NetworkState:
        sources = self.value(fields["sources"])
        machines = tuple(self.value(fields["machines"]))
        names = {id(m): n for m, n in zip(machines, fields["names"]) if n is not None}
        return NetworkState(sources=dict(sources), data={k: None for k in sources},
                            outputs=dict(self.value(fields["outputs"])), machines=machines, names=names)

    def _report(self, fields: dict[str, Any]) -> FitReport:
        r = FitReport.__new__(FitReport)
        r.__dict__.update(self.value(fields["attrs"]))
        r.actions = ActionMap(self.value(fields["actions"]), r.labels)
        r.trace = Trace(executor=fields.get("trace_executor", "serial"), kind="fit")
        r._fit_tasks = {}
        return r


def load(path: str | os.PathLike[str], *, trusted: Sequence[Any] | None = None) -> Any:
    """Load what :func:`save` wrote: the network, machine or estimator, fitted, without training data.

    Sources come back without data: call a loaded node on new data (``yhat(Xnew)`` or ``yhat(X=Xnew)``), or
    give its sources data (``X.data = ...``) before fitting it again.  Values saved from a GPU go back to it
    where it exists here; elsewhere they stay on the host and their machines run on the CPU, with a
    :class:`~gpunets.DeviceFallbackWarning` (``gn.config(fallback="raise")`` makes it an error).

    Parameters
    ----------
    path : str or path-like
        A file written by :func:`save`.
    trusted : list of str or type, optional
        For ``format="skops"`` files only: types (or functions) to trust beyond gpunets', NumPy's and
        scikit-learn's, by their full name as the error lists them (``"mymodule.MyComposite"``).

    Returns
    -------
    object
        What was saved, with new identities (as a copy made with :mod:`copy` or :mod:`pickle` has).

    Raises
    ------
    PersistenceError
        A ``ValueError``: the file was not written by :func:`save`, or by a gpunets version that is not
        compatible with this one (both versions are named).
    UntrustedTypesError
        A ``TypeError``: a skops file holds types that are not trusted; the message names them.
    ValueError
        ``trusted=`` given for a pickle file (whose loading runs code whatever is trusted).

    Examples
    --------
    >>> import os, tempfile, zipfile, gpunets as gn
    >>> path = os.path.join(tempfile.mkdtemp(), "not-mine.zip")
    >>> with zipfile.ZipFile(path, "w") as zf:
    ...     zf.writestr("model.pkl", b"...")
    >>> gn.load(path)
    Traceback (most recent call last):
    ...
    gpunets.persist.PersistenceError: '...not-mine.zip' was not written by gn.save ...
    """
    path = os.fspath(path)
    if trusted is not None and (isinstance(trusted, (str, bytes)) or not isinstance(trusted, (list, tuple, set))):
        msg = (f"gn.load: trusted= takes a list of type names or types, e.g. trusted=['mymodule.MyComposite']; "
               f"got {trusted!r}.")
        raise TypeError(msg)
    try:
        zf = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        msg = f"{path!r} was not written by gn.save (it is not a zip archive); gn.load reads only gn.save's files."
        raise PersistenceError(msg) from exc
    with zf:
        meta = _read_meta(zf, path)
        fmt = meta["format"]
        if fmt == "pickle" and trusted is not None:
            msg = (f"gn.load: {path!r} is a pickle file, and loading a pickle runs code whatever trusted= says; "
                   f"trusted= applies to format='skops' files only. Load it with gn.load(path) only if you trust "
                   f"where it comes from; ask for a format='skops' file otherwise.")
            raise ValueError(msg)
        payload = zf.read(_PAYLOAD[fmt])
    archive = pickle.loads(payload) if fmt == "pickle" else _load_skops(payload, trusted, path)
    if not isinstance(archive, _Archive):
        msg = f"{path!r}: the file is damaged (its payload is a {type(archive).__name__}, not a gpunets archive)."
        raise PersistenceError(msg)
    try:
        return _Decoder(archive, path).run()
    except (KeyError, AttributeError, IndexError) as exc:   # a payload that gn.save did not write
        msg = f"{path!r}: the file is damaged ({type(exc).__name__}: {exc} while rebuilding the network)."
        raise PersistenceError(msg) from exc
