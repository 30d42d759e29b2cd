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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpunets.core.machines import STATIC, RemoteEstimator
from gpunets.core.nodes import AbstractNode, Node, Source, is_node
from gpunets.devices import store as _store
from gpunets.devices.cache import digest
from gpunets.devices.fingerprint import fingerprint
from gpunets.devices.placement import Device
from gpunets.devices.store import Store
from gpunets.devices.store_keys import library_versions, stable_key

if TYPE_CHECKING:  # pragma: no cover
    from gpunets.core.machines import Machine

__all__ = ["STORED", "StoreKeys", "storable", "stored_task", "commit_and_store"]

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


def stored_task(est: Any, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A fit task's value for a state loaded from the store: the estimator and its fit's info."""
    return est, info


def commit_and_store(store: Store, key: bytes, commit: Callable[..., None], est: Any, info: dict[str, Any],
                     *output: Any) -> None:
    """Commit a fit, then write its state under ``key`` (a state kept on a Dask worker is fetched to write it:
    the store is the client's)."""
    commit(est, info, *output)
    if isinstance(est, RemoteEstimator):
        if est.lost:
            return
        est = est.gather()
    keep = {k: info[k] for k in ("seconds", "path", "n_rows") if k in info}
    store.put(key, (est, keep))
