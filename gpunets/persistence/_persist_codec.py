"""The object-graph codec of :mod:`gpunets.persistence.persist`: what a saved network is made of, and back.

:class:`Encoder` turns the object saved into an :class:`Archive` without touching the live objects:

* sources, nodes and machines become entries of one table, referred to by index (:class:`Ref`), so shared
  parts are written once and a deep network needs no deep recursion; sources keep only their name;
* a machine's fitted state keeps its estimator, device, route, rows and history, not what the fit recorded
  of its training data (the next fit of a loaded network always trains);
* a composite's fitted network keeps its sources (without data), outputs and machines, and names its
  components by position (they are keyed by ``id()`` in memory); a fit report keeps actions, labels and
  times, not its trace;
* GPU values (CuPy arrays, cuDF objects) are copied to the host as :class:`HostValue`, fitted cuML
  estimators are stored as their scikit-learn twins (cuML's ``as_sklearn()``);
* executors are stored as what they were made from (a Dask executor as the name ``"dask"``);
* anything else that holds one of these is copied shallowly with its attributes encoded; attributes its class
  names in ``_gn_unsaved`` (training data kept for a rebuild, e.g. a conversion's context) are written as None.

:class:`Decoder` builds it back: graph objects with new identities (their ``__setstate__``, as a copy gets),
and values saved from a GPU on that GPU where it exists here, else on the host with the fallback policy's
warning.  It builds only what the encoder writes: a record of another kind, or a machine operation that is
not one, is a :class:`DamagedFile`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import os
import types
import warnings
from typing import Any

import numpy as np

from gpunets.api.report import ActionMap, FitReport
from gpunets.base.config import get_config
from gpunets.base.trace import Trace
from gpunets.compose.composite import Composite, NetworkState
from gpunets.compute.models import (
    _fall_back,
    cuml_installed,
    cuml_twin_class,
    fitted_as_sklearn,
    is_cuml_estimator,
)
from gpunets.core.machines import OPERATIONS, FittedState, Machine
from gpunets.core.nodes import AbstractNode, Node, Source, mark_data_not_saved
from gpunets.devices._gpulibs import loaded_cupy
from gpunets.devices.data import device_of, fortran_only, is_cudf, is_cupy_array, to_device
from gpunets.devices.placement import CPU, Device, check_available, local_ordinal
from gpunets.devices.store import Store
from gpunets.executors import Executor, SerialExecutor, StreamsExecutor, ThreadsExecutor

__all__ = ["Archive", "Ref", "Record", "Items", "HostValue", "Encoder", "Decoder", "DamagedFile"]


class DamagedFile(ValueError):
    """The payload holds something :class:`Encoder` never writes (reported by ``gn.load`` as a damaged file)."""


# Executors are saved as what they were made from; a Dask executor as the name "dask" (its client stays behind).
_EXECUTORS: dict[str, type[Executor]] = {"serial": SerialExecutor, "threads": ThreadsExecutor,
                                         "streams": StreamsExecutor}


# ----------------------------------------------------------------- what the payload is made of


class Ref:
    """A reference to entry ``i`` of the archive's table (a source, node or machine)."""

    def __init__(self, i: int) -> None:
        self.i = i


class Record:
    """A gpunets object written field by field (``kind``: source, node, machine, state, network, report)."""

    def __init__(self, kind: str, fields: dict[str, Any]) -> None:
        self.kind = kind
        self.fields = fields


class Items:
    """A dict whose keys are not strings or numbers (e.g. machines), as a list of pairs."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs


class HostValue:
    """A value that lived on a GPU, copied to the host, and the device it goes back to when loaded."""

    def __init__(self, value: Any, device: str) -> None:
        self.value = value
        self.device = device


class Archive:
    """The payload: the object saved (with references into the table) and the table of graph objects."""

    def __init__(self, root: Any, table: list[Record]) -> None:
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


class Encoder:
    """Turns the object saved into an :class:`Archive`, leaving the live objects untouched.

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

    def run(self, root: Any) -> Archive:
        enc = self.value(root)
        while self.pending:
            i, obj = self.pending.pop()
            self.table[i] = self.record(obj)
        return Archive(enc, self.table)

    def ref(self, obj: Any) -> Ref:
        i = self.index.get(id(obj))
        if i is None:
            i = self.index[id(obj)] = len(self.table)
            self.table.append(None)
            self.pending.append((i, obj))
            self.keep.append(obj)
        return Ref(i)

    # --- graph objects: one table entry each
    def record(self, obj: Any) -> Record:
        attrs = _attrs(obj)
        attrs.pop("_uid", None)
        if isinstance(obj, Source):
            return Record("source", {"name": obj.name})
        if isinstance(obj, Node):
            attrs.pop("_cost", None)   # measured durations: measured again
            op = attrs.get("operation")
            if callable(op) and not _importable(op):
                msg = (f"Cannot save node {obj._short()!r}: its operation {_function_name(op)} is a lambda or a "
                       f"function defined inside another function, which neither pickle nor skops can store "
                       f"(they store functions by module and name). Define it with def at the top level of a "
                       f"module, then build the node again.")
                raise TypeError(msg)
            return Record("node", {"class": type(obj).__name__, "attrs": self.value(attrs)})
        return Record("machine", {"class": type(obj).__name__, "attrs": self.value(attrs)})

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
            if is_cupy_array(x) and fortran_only(x):   # CuPy copies to the host in C order: the layout is kept
                return HostValue(x.get(order="F"), dev)
            return HostValue(to_device(x, CPU), dev)
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
            return Record("executor", {"name": name, "args": self.value(args)})
        if isinstance(x, Store):
            msg = (f"Cannot save {x!r}: a store of fitted states is a folder of this machine, set with "
                   f"gn.config(store=...), not part of a network; gn.save never writes one (and gn.load never opens "
                   f"one: a file that names a store is refused). Set the attribute that holds it to None (or its "
                   f"path, a string) before saving, and give the loading process its own gn.config(store=...).")
            raise TypeError(msg)
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
        return Items([(self.value(k), self.value(v)) for k, v in d.items()])

    def obj(self, x: Any) -> Any:
        attrs = getattr(x, "__dict__", None)
        items = dict(x) if isinstance(x, dict) else None
        if not isinstance(attrs, dict) and items is None:
            return x
        unsaved = getattr(type(x), "_gn_unsaved", ())   # attributes that hold training data: written as None
        enc_attrs = {k: None if k in unsaved else self.value(v) for k, v in (attrs or {}).items()}
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

    def state(self, st: FittedState) -> Record:
        fields = {f.name: getattr(st, f.name) for f in dataclasses.fields(st) if f.name != "stored"}
        est = st.estimator   # a state left on a Dask worker is fetched: the file holds every fitted estimator
        converted = ""
        if st.path == "cuml" and is_cuml_estimator(est):
            self.devices.add(st.device)
            twin = fitted_as_sklearn(est)   # cuML's InteropMixin: the fitted scikit-learn twin
            # no CPU twin (MinMaxScaler, GaussianNB, ... have no as_sklearn): the cuML estimator itself is saved
            est, converted = (twin, "cuml") if twin is not None else (est, "cuml-native")
        # what a fit recorded of its training data is not kept: the next fit of a loaded network always trains
        fields.update(estimator=est, params={}, upstream=b"")
        return Record("state", {"fields": self.value(fields), "converted": converted})

    def network(self, ns: NetworkState) -> Record:
        return Record("network", {
            "sources": self.value(dict(ns.sources)), "outputs": self.value(dict(ns.outputs)),
            "machines": self.value(tuple(ns.machines)),
            "names": [ns.names.get(id(m)) for m in ns.machines],   # keyed by id(): rebuilt when loaded
        })

    def report(self, r: FitReport) -> Record:
        attrs = {k: v for k, v in vars(r).items() if k not in ("trace", "actions", "_fit_tasks")}
        return Record("report", {"attrs": self.value(attrs), "actions": self.value(dict(r.actions)),
                                  "trace_executor": getattr(r.trace, "executor", r.executor)})


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


class Decoder:
    """Rebuilds the saved object from an :class:`Archive`: graph objects with new identities, GPU values moved
    back to their device where it exists here (else kept on the host, with the fallback policy's warning)."""

    def __init__(self, archive: Archive, path: str) -> None:
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
                msg = f"the file is damaged (an unknown graph entry {rec.kind!r})."
                raise DamagedFile(msg)
            self.objects.append(cls.__new__(cls))
        for obj, rec in zip(self.objects, self.archive.table):
            if rec.kind == "source":
                obj.__setstate__((None, {"name": rec.fields["name"], "_data": None, "_version": 0}))
                mark_data_not_saved(obj)
            elif rec.kind == "node":
                attrs = self.value(rec.fields["attrs"])
                if attrs.get("machine") is not None and attrs.get("operation") not in OPERATIONS:
                    msg = (f"the file is damaged (a machine operation {attrs.get('operation')!r}; "
                           f"operations are {list(OPERATIONS)}).")
                    raise DamagedFile(msg)
                obj.__setstate__((None, attrs))
            else:
                obj.__setstate__(self.value(rec.fields["attrs"]))
        root = self.value(self.archive.root)
        self._settle()
        if self.converted:   # fitted attributes naming the network's estimators (a stack's estimators_)
            for comp in self.composites:
                comp._gn_after_fit(comp._gn_state)
        return root

    def _settle(self) -> None:
        """Wait for the copies to the GPUs to finish: they were issued on this thread's current stream, and the
        loaded values are read later by runs on other streams, which have no event to wait for."""
        cuda = [d for d in self.targets.values() if d.is_cuda]
        if not cuda:
            return
        cp = loaded_cupy()
        if cp is None:
            return
        for d in cuda:
            with cp.cuda.Device(local_ordinal(d.index or 0)):
                cp.cuda.get_current_stream().synchronize()

    def target(self, dev: str) -> Device:
        """Where values saved on ``dev`` go: there if it exists here, else the CPU (warned once per load)."""
        if dev not in self.targets:
            what = f"the network loaded from {os.path.basename(self.path)!r} (fitted on {dev})"
            self.targets[dev] = check_available(dev, what=what)
        return self.targets[dev]

    def value(self, x: Any) -> Any:
        if x is None or isinstance(x, _SCALARS):
            return x
        if isinstance(x, Ref):
            return self.objects[x.i]
        key = id(x)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = x    # cycles and repeats: visited once
        out = self._decode(x)
        self.memo[key] = out
        return out

    def _decode(self, x: Any) -> Any:
        if isinstance(x, HostValue):
            dev = self.target(x.device)
            if dev.is_cpu:
                return x.value
            try:
                out = to_device(x.value, dev)
                fortran = isinstance(x.value, np.ndarray) and fortran_only(x.value) and is_cupy_array(out)
                return loaded_cupy().asfortranarray(out) if fortran else out
            except ImportError:   # a cuDF frame where cuDF is not installed: it stays a pandas frame
                return x.value
        if isinstance(x, Record):
            if x.kind not in ("state", "network", "report", "executor"):
                msg = f"the file is damaged (an unknown record {x.kind!r})."
                raise DamagedFile(msg)
            return getattr(self, f"_{x.kind}")(x.fields)
        if isinstance(x, Items):
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
        if converted == "cuml-native":   # say which: this state needs cuML (and a GPU) wherever it is loaded
            warnings.warn(f"{os.path.basename(self.path)!r}: the fitted {type(est).__name__} was saved as the cuML "
                          f"estimator itself (cuML offers no scikit-learn twin of it), not as a scikit-learn "
                          f"estimator; it runs only where cuML and a GPU are.", UserWarning, stacklevel=4)
        del saved["estimator"]   # the file's name for it; the state's field is ``stored``
        saved.update(stored=est, device=str(dev), path=path)
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
