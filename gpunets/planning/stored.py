"""Store keys of a fit plan: where a machine would fit, a state stored under its key is loaded instead.

A fit's key (:meth:`StoreKeys.fit_key`) is a 128-bit digest of everything that decides the fitted state:

* the estimator's class and hyperparameters (:func:`~gpunets.devices.store_keys.stable_key`: nested
  estimators, functions by code and defaults);
* the *upstream digest*: for each training argument, the key of its value, made along the network the way
  the cache of node outputs makes its keys, but from stable names only: a source's data by its content
  fingerprint and the rows taken, an operation node by its operation's stable name, its constants and its
  inputs' keys, a machine's operation by the operation and the key of the machine's state (its fit key);
* the operation (a fit; keyword training arguments by name), the device kind (``cpu``, ``cuda``) and route
  (``sklearn``, ``cuml``, ``array_api``);
* the versions of gpunets and of every library whose classes or functions the key named.

None of it names an object id or a process-local version counter, so a new session with the same data and the
same network finds the same keys.  What cannot be named stably (an object that does not pickle) gives no key:
that machine, and every machine downstream of it, fits as without a store.

The planner (:func:`gpunets.planning.plan.compile_fit`) looks each key up when it compiles the fit: a hit
becomes a task that returns the loaded state (labelled ``load <machine> (stored)`` in the trace), needs no
training data (the tasks that only fed it are pruned, as for a cache hit), and commits like a fit with the
action ``"stored"``.  A miss fits as before and, once the fit succeeded, writes the state under its key.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpunets.base._warn import warn_once
from gpunets.base.config import get_config
from gpunets.compute.models import fitted_on_host
from gpunets.core.machines import STATIC, RemoteEstimator
from gpunets.core.nodes import AbstractNode, Node, Source, is_node
from gpunets.devices import store as _store
from gpunets.devices.cache import digest
from gpunets.devices.fingerprint import fingerprint
from gpunets.devices.placement import Device, DeviceFallbackWarning
from gpunets.devices.store import Store
from gpunets.devices.store_keys import library_versions, stable_key

if TYPE_CHECKING:  # pragma: no cover
    from gpunets.core.machines import Machine

__all__ = ["STORED", "GPU_ROUTES", "Hit", "StoreKeys", "storable", "stored_task", "commit_and_store", "lookup",
           "read_state", "state_of", "write_state", "WRITTEN"]

logger = logging.getLogger("gpunets")

#: The routes of a state fitted on a GPU: such a state's entry also holds its CPU twin (:func:`commit_and_store`).
GPU_ROUTES = ("cuml", "array_api")

#: The action of a machine whose state was loaded from the store instead of fitted.
STORED = "stored"


def storable(est: Any) -> bool:
    """Whether a fitted ``est`` goes to the store: not a composite or stack (its own network's machines are
    stored one by one, and its state would hold its network)."""
    return not callable(getattr(est, "_gn_build", None))


def _data_key(x: Any) -> bytes | None:
    fp = fingerprint(x)
    if isinstance(fp, tuple) and fp and fp[0] == "object":   # named by identity: not stable
        return None
    return repr(fp).encode()


class StoreKeys:
    """The store keys of one compile: each node's value key and each machine's fit key, each made once.

    ``actions(m)`` is each machine's action in this compile; ``rows`` the rows the fit takes (bytes).
    """

    def __init__(self, actions: Callable[[Machine], str | None], rows: bytes) -> None:
        self.actions = actions
        self.rows = rows
        self.values: dict[int, bytes | None] = {}     # node uid -> key of its value
        self.machines: dict[int, bytes | None] = {}   # machine uid -> key of the state this plan uses

    def set_machine(self, m: Machine, key: bytes | None) -> None:
        """The key of the state ``m`` will have once this plan ran (its fit's key)."""
        self.machines[m._uid] = key

    def fit_key(self, m: Machine, device: Any, path: str) -> bytes | None:
        """The key of a fit of ``m`` on ``device`` (a :class:`~gpunets.devices.placement.Device`) by ``path``."""
        args: list[bytes] = []
        for a in m.args:
            k = self.value(a)
            if k is None:
                return None
            args.append(k)
        libs: set[str] = {"gpunets"}
        spec = stable_key(m.model, libs)
        if spec is None:
            return None
        kind = "cuda" if getattr(device, "is_cuda", False) else "cpu"
        return digest(b"gnfit", spec, *args, ",".join(m.fit_keywords).encode(), kind.encode(), path.encode(),
                      _store.VERSION.encode(), library_versions(libs - {"gpunets"}))

    def warm_key(self, m: Machine, device: Any, path: str, warm: Any) -> bytes | None:
        """The key of a warm update of ``m``'s current state (continued to the new hyperparameters by ``warm``,
        ``(method, times)``): the key of that state, chained with a fit's key for the new hyperparameters. None
        when the state has no key (it was fitted with no store in force)."""
        st = m._state
        previous = getattr(st, "key", None) if st is not None else None
        base = self.fit_key(m, device, path)
        if previous is None or base is None:
            return None
        return digest(b"gnwarm", previous, base, repr(tuple(warm)).encode())

    def _state_key(self, m: Machine) -> bytes | None:
        """The key of the state a machine that does not fit in this plan uses (its state's, else made now)."""
        st = m._state
        if st is None:
            return None
        key = getattr(st, "key", None)
        if key is not None:
            return key
        if st.action == STATIC:
            spec = stable_key(m.model)
            return None if spec is None else digest(b"gnstatic", spec)
        if m.frozen or self.actions(m) is None:   # a state kept on purpose, or not decided here: unknown
            return None
        return self.fit_key(m, Device.parse(st.device), st.path)

    def value(self, n: AbstractNode) -> bytes | None:
        """The key of node ``n``'s value in this fit (None: not stably nameable), made iteratively."""
        memo = self.values
        if n._uid in memo:
            return memo[n._uid]
        stack: list[AbstractNode] = [n]
        while stack:
            x = stack[-1]
            if x._uid in memo:
                stack.pop()
                continue
            m = x.machine if isinstance(x, Node) else None
            todo = [a for a in x.args if is_node(a) and a._uid not in memo]
            if m is not None and m._uid not in self.machines:
                todo += [a for a in m.args if a._uid not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            if m is not None and m._uid not in self.machines:
                self.machines[m._uid] = self._state_key(m)
            memo[x._uid] = self._make(x, m)
        return memo[n._uid]

    def _make(self, x: AbstractNode, m: Machine | None) -> bytes | None:
        if isinstance(x, Source):
            data = _data_key(x._data)
            return None if data is None else digest(b"src", data, self.rows)
        parts: list[bytes] = []
        for a in x.args:
            if is_node(a):
                k = self.values[a._uid]
                if k is None:
                    return None
                parts.append(k)
            else:
                c = stable_key(a)
                if c is None:
                    return None
                parts.append(b"c" + c)
        assert isinstance(x, Node)
        if m is not None:
            mk = self.machines.get(m._uid)
            if mk is None:
                return None
            return digest(b"mop", str(x.operation).encode(), mk, *parts)
        op = stable_key(x.operation)
        return None if op is None else digest(b"op", op, *parts)


@dataclass
class Hit:
    """A state found in the store: the estimator, its fit's info, the key the machine's state carries (the fit
    it came from: downstream keys are made from it) and, for a GPU state's CPU twin, where it came from."""

    estimator: Any
    info: dict[str, Any]
    key: bytes
    note: str = ""


def lookup(store: Store, keys: StoreKeys, m: Machine, key: bytes, gpu: Any, what: str) -> Hit | None:
    """The state stored under ``key``, else, where ``m`` was placed on the GPU ``gpu`` but runs on the CPU (no
    GPU here, or no GPU route), the CPU twin of a state fitted on that kind of GPU, as the fallback policy
    says: ``"raise"`` refuses it, ``"warn"`` warns once naming the machine, ``"silent"`` logs it."""
    loaded = store.get(key)
    if isinstance(loaded, tuple) and len(loaded) == 2:
        return Hit(loaded[0], loaded[1], key)
    if isinstance(loaded, tuple) and len(loaded) == 3:   # a GPU state (and its CPU twin), on a GPU here
        try:
            return Hit(pickle.loads(loaded[0]), loaded[1], key)
        except Exception:  # noqa: BLE001 - a class that no longer loads (cuML gone): a miss
            return None
    policy = get_config()["fallback"]
    if gpu is None or policy == "raise":
        return None
    for route in GPU_ROUTES:
        gkey = keys.fit_key(m, gpu, route)
        if gkey is None:
            return None
        entry = store.get(gkey, probe=True)   # the GPU state stays pickled: only its CPU twin is read
        if not (isinstance(entry, tuple) and len(entry) == 3):
            continue
        info, (est, how) = entry[1], entry[2]
        note = f"from a GPU state fitted on cuda ({route}), converted for the CPU: {how}"
        msg = (f"{what} is placed on {gpu} but runs on the CPU here: its state was loaded from the store, {note}. "
               "Its answers may differ from the GPU's in the last bits. Place it on 'cpu' to fit it here instead, "
               "or use gn.config(fallback='raise') to refuse GPU states.")
        if policy == "warn":
            warn_once(("stored GPU state", what, route), msg, DeviceFallbackWarning, owner=m)
        else:
            logger.info(msg)
        return Hit(est, info, gkey, note)
    return None


def stored_task(est: Any, info: dict[str, Any], key: bytes | None = None) -> tuple[Any, dict[str, Any]]:
    """A fit task's value for a state loaded from the store: the estimator and its fit's info (``key``: the
    entry it came from, which a Dask worker that shares the store reads instead of receiving the state)."""
    return est, info


#: Set in a fit's info by a Dask worker that wrote the state to a store it shares with the client.
WRITTEN = "_gn_stored_on_worker"


def read_state(store: Store, key: bytes) -> Any:
    """The fitted estimator stored under ``key`` in the form that runs here (a GPU state as it is), or None."""
    return state_of(store.get(key))


def state_of(loaded: Any) -> Any:
    """The fitted estimator in an entry ``loaded`` as :func:`write_state` wrote it (a GPU state unpickled
    here), or None."""
    if isinstance(loaded, tuple) and len(loaded) == 3:
        try:
            return pickle.loads(loaded[0])
        except Exception:  # noqa: BLE001 - a class that no longer loads (cuML gone): a miss
            return None
    return loaded[0] if isinstance(loaded, tuple) and len(loaded) == 2 else None


def commit_and_store(store: Store, key: bytes, commit: Callable[..., None], est: Any, info: dict[str, Any],
                     *output: Any) -> None:
    """Commit a fit, then write its state under ``key`` (a state kept on a Dask worker is fetched to write it,
    unless the worker shares the store and wrote it itself)."""
    written = info.get(WRITTEN, False)
    if written:
        info = {k: v for k, v in info.items() if k != WRITTEN}
    commit(est, info, *output)
    if written:
        return
    if isinstance(est, RemoteEstimator):
        if est.lost:
            return
        est = est.gather()
    write_state(store, key, est, info)


def write_state(store: Store, key: bytes, est: Any, info: dict[str, Any]) -> None:
    """Write a fitted state under ``key``: with its CPU twin when it was fitted on a GPU."""
    keep = {k: info[k] for k in ("seconds", "path", "n_rows", "same_output") if k in info}
    if keep.get("path") in GPU_ROUTES and str(info.get("device", "")).startswith("cuda"):
        # a GPU state: pickled on its own, next to its CPU twin, so that a process with no GPU reads the twin
        # without unpickling a GPU object (docs/store.md, "Devices")
        try:
            twin = fitted_on_host(est)
            gpu = _store.dumps(est)
        except Exception:  # noqa: BLE001 - no scikit-learn twin (cuML), or it does not pickle: stored as it is
            pass
        else:
            store.put(key, (gpu, keep, twin))
            return
    store.put(key, (est, keep))
