"""The store of fitted states on a Dask cluster whose workers share its folder (docs/store.md, "Dask").

Once per (cluster, store), the client writes a marker file with a random token in the store and asks every
worker to read it back (:func:`shared`).  Where every worker sees it (the same filesystem: a ``LocalCluster``
always does), the workers read and write entries themselves and the client sends keys, not states:

* a state the compile found in the store is loaded on the worker by its key (:func:`load_on_worker`);
* a fit writes its state on the worker as soon as it is done (:func:`fit_and_write`): the state stays there,
  as the executor keeps states on the workers, and is never fetched to the client to be written;
* every task runs under the caller's store (:func:`in_store`), as on the in-process executors: what looks in
  the store where it runs (a search's step fits and results, :mod:`gpunets.tuning.stored`; the fit of a
  composite's own network inside a task) reads and writes it on the worker.

Where a worker cannot see it, the store stays the client's: hits are sent with their task, and a state fitted
on a worker is fetched to the client to be written.  The functions here are module-level so that they pickle
by reference.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from functools import partial
from typing import Any

from gpunets.base.config import config
from gpunets.devices.store import Store
from gpunets.planning.stored import WRITTEN, commit_and_store, read_state, stored_task, write_state

__all__ = ["shared", "worker_functions", "load_on_worker", "fit_and_write", "in_store", "under_store"]

logger = logging.getLogger("gpunets")

_SHARED: dict[tuple[str, str], bool] = {}   # (scheduler address, store folder) -> every worker sees it
_LOCK = threading.Lock()
_OPEN: dict[tuple[str, int, bool], Store] = {}     # on a worker: the stores its tasks run under, one per folder and size


def _sees(marker: str, token: str) -> bool:
    try:
        with open(marker) as f:
            return f.read() == token
    except OSError:
        return False


def shared(client: Any, store: Store) -> bool:
    """Whether every worker of ``client``'s cluster sees ``store``'s folder (asked once per cluster)."""
    where = (str(getattr(getattr(client, "scheduler", None), "address", id(client))), store.path)
    with _LOCK:
        if where in _SHARED:
            return _SHARED[where]
    token = uuid.uuid4().hex
    marker = os.path.join(store.path, f".gpunets-shared-{token}")
    ok = False
    try:
        with open(marker, "w") as f:
            f.write(token)
        seen = client.run(_sees, marker, token, on_error="return")
        ok = bool(seen) and all(v is True for v in seen.values())
    except Exception:  # noqa: BLE001, S110 - no answer: not shared
        pass
    finally:
        with contextlib.suppress(OSError):
            os.remove(marker)
    with _LOCK:
        _SHARED[where] = ok
    if not ok:   # once per cluster and store: said where it is looked for, not as a warning
        logger.info("the Dask workers of %s do not all see the store's folder %r: the store is the client's only "
                    "(states are sent to and fetched from the workers; a search's steps fit there without it; "
                    "docs/store.md, Dask)", where[0], store.path)
    return ok


def load_on_worker(store: Store, key: bytes, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A stored state, read on the worker by its key."""
    est = read_state(store, key)
    if est is None:
        msg = (f"the stored state {key.hex()} was found when the fit was compiled but is no longer in the store "
               f"{store.path!r} (evicted or deleted meanwhile). Hint: fit again; it is fitted and written anew.")
        raise LookupError(msg)
    return est, info


def fit_and_write(store: Store, key: bytes, fn: Any, *args: Any) -> Any:
    """Run a fit task on the worker, then write its state to the store it shares with the client."""
    value = fn(*args)
    est, info = value[0], value[1]
    write_state(store, key, est, info)
    return (est, {**info, WRITTEN: True}, *value[2:])


def _opened(path: str, max_bytes: int, outputs: bool = False) -> Store:
    """The worker's :class:`Store` of ``path`` (opened once per process: its counters carry on), keeping
    training outputs where the caller's does (``gn.Store(path, outputs=True)``)."""
    with _LOCK:
        s = _OPEN.get((path, max_bytes, outputs))
        if s is None:
            s = _OPEN[(path, max_bytes, outputs)] = Store(path, max_bytes, outputs=outputs)
        return s


def under_store(where: tuple[Any, ...], payload: bytes, *args: Any) -> Any:
    """Run a pickled task function (``payload``) on the worker with the store ``where`` (its folder and size)
    in force (``gn.config(store=...)``), as the caller's is on the in-process executors."""
    import cloudpickle

    fn = cloudpickle.loads(payload)
    with config(store=_opened(*where)):
        return fn(*args)


def in_store(store: Store, payloads: dict[int, bytes]) -> dict[int, bytes]:
    """Each pickled task function, wrapped to run under ``store`` on the worker (:func:`under_store`); the
    functions are not pickled again, only the folder's name goes with them."""
    import cloudpickle

    where = (store.path, store.max_bytes, store.outputs)
    return {k: cloudpickle.dumps(partial(under_store, where, p)) for k, p in payloads.items()}


def worker_functions(tasks: list[Any], store: Store) -> dict[int, Any]:
    """The tasks whose functions change when the workers share ``store``: loads by key, fits that write."""
    out: dict[int, Any] = {}
    for t in tasks:
        fn, commit = t.fn, t.commit
        if isinstance(fn, partial) and fn.func is stored_task and len(fn.args) == 3 and fn.args[2] is not None:
            out[t.key] = partial(load_on_worker, store, fn.args[2], fn.args[1])
        elif isinstance(commit, partial) and commit.func is commit_and_store and commit.args[0] is store:
            out[t.key] = partial(fit_and_write, store, commit.args[1], fn)
    return out
