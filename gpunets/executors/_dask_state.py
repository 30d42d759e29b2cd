"""Fitted states that stay on the Dask workers: a machine's estimator, held there by a key, fetched on demand.

After a fit on a cluster that outlives the run, a machine's state is a :class:`DaskState`: a future of the
key ``gpunets-state-<machine>-v<version>-<run>`` (the fitted estimator and its path, on the worker that
fitted it) and the small attributes a report needs.  The key changes only when the machine retrains.
Evaluations add the future to their graph as a dependency, so only new data and small task descriptions
travel.  The client fetches the estimator only when asked (``mach.estimator_``, ``fitted_params``,
``report`` of a composite's components, pickling, ``gn.save``, another executor).

The key is released when the state is dropped: the machine retrains (the old state goes with its last
reference, at once unless a call running in another thread still uses it), or is garbage collected
(a ``weakref.finalize``), or when the executor that made it closes (it fetches the estimator first, so the
machine stays usable).  A worker that dies with the key: Dask recomputes it from the fit's inputs, which
the state keeps on the cluster; if those died too, the state is rebuilt from its *recipe* (the fit's part
of the graph, with the client's copies of its source data, sent again) under a new key, or, if the client
has fetched the estimator, that copy is sent again.  Only when neither is possible (the client closed) is
the state *lost*: an evaluation says so and the machine retrains on its next fit.

No dask import here: the futures are used through their methods.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from typing import Any

from gpunets.base.exceptions import NotFittedError
from gpunets.core.machines import RemoteEstimator
from gpunets.devices.data import device_of, is_cupy_array, to_device
from gpunets.devices.placement import Device, same_device

__all__ = ["DaskState", "SUMMARY_ATTRIBUTES", "Recipe", "GraphKey", "ClientValue", "StateInput"]

#: The attributes of a fitted estimator that come back with every fit (small, needed by reports and refits).
SUMMARY_ATTRIBUTES = ("report_", "fit_report_", "_gn_incremental")

_MISSING = object()


def _release_all(futures: list[Any]) -> None:
    for f in futures:
        try:
            f.release()
        except Exception:  # noqa: BLE001, S110 - its client already closed: nothing is held any more
            pass


class GraphKey:
    """In a recipe: another task of the recipe."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class ClientValue:
    """In a recipe: a value the client holds (source data), scattered again on a rebuild."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class StateInput:
    """In a recipe: the fitted state of an upstream machine (a ``FittedState``), or a kept fit's ``DaskState``."""

    __slots__ = ("state",)

    def __init__(self, state: Any) -> None:
        self.state = state


class Recipe:
    """How a kept state was computed: ``{key: task tuple}`` (inputs as the markers above) and its root key."""

    __slots__ = ("tasks", "root")

    def __init__(self, tasks: dict[str, tuple[Any, ...]], root: str) -> None:
        self.tasks, self.root = tasks, root


_BAD = ("error", "cancelled", "lost")


class DaskState(RemoteEstimator):
    """A fitted estimator kept on a Dask worker (see the module docstring).

    Parameters
    ----------
    label : str
        The machine's label, for messages.
    client : distributed.Client
        The client that holds the key.
    future : distributed.Future
        The key's future; its value is ``(estimator, {"path": path})``.
    attrs : dict
        :data:`SUMMARY_ATTRIBUTES` of the fitted estimator, fetched with the fit.
    inputs : list of distributed.Future
        The fit's scattered inputs, held so that Dask can recompute the key if its worker dies.
    timeout : float, optional
        Seconds a fetch may take.
    recipe : Recipe, optional
        How to compute the state again if the cluster loses it and its inputs.
    """

    def __init__(self, label: str, client: Any, future: Any, attrs: dict[str, Any], inputs: list[Any],
                 timeout: float | None = None, recipe: Recipe | None = None) -> None:
        self.label = label
        self.client = client
        self.key = future.key
        self.attrs = attrs
        self.timeout = timeout
        self.recipe = recipe
        self.rebuilds = 0
        self._lock = threading.RLock()
        self._future: Any = future
        self._local: Any = _MISSING
        self._released = False
        self.lost = False
        self._held = [future, *inputs]
        self._finalizer = weakref.finalize(self, _release_all, self._held)

    # --- the client's view --------------------------------------------------------------
    def gather(self) -> Any:
        """The fitted estimator, fetched from its worker the first time (thread-safe)."""
        with self._lock:
            if self._local is not _MISSING:
                return self._local
            for attempt in (1, 2):   # a key lost while fetching it is rebuilt once
                fut = self._usable_future()
                if fut is None:
                    raise NotFittedError(self._lost_message())
                try:
                    est = fut.result(timeout=self.timeout)[0]
                    break
                except Exception as e:  # noqa: BLE001 - a lost key, a closed client: one message
                    if attempt == 1 and fut.status in _BAD and self.recipe is not None:
                        continue
                    self.lost = True
                    msg = f"{self._lost_message()} ({type(e).__name__}: {e})"
                    raise NotFittedError(msg) from e
            est = _on_recorded_device(est, self.attrs.get("_device"))
            self._local = est
            return est

    def peek(self, name: str, default: Any = None) -> Any:
        if name in SUMMARY_ATTRIBUTES:
            return self.attrs.get(name, default)
        return getattr(self.gather(), name, default)

    @property
    def fetched(self) -> bool:
        """True once the estimator is on the client too."""
        return self._local is not _MISSING

    def local_copy(self) -> Any:
        """The estimator if the client has it, else ``_MISSING``."""
        return self._local

    # --- the executor's view --------------------------------------------------------------
    def future_on(self, client: Any) -> Any:
        """The key's future if it is usable on ``client`` (same client, still held), rebuilt if the
        cluster lost it; None if it cannot be had there (another client, released, lost)."""
        if client is not self.client:
            return None
        with self._lock:
            return self._usable_future()

    def _usable_future(self) -> Any:
        """The future, rebuilt or sent again from the client's copy if the cluster lost it (lock held)."""
        fut = self._future
        if fut is None or self.lost:
            return None
        if fut.status not in _BAD:
            return fut
        try:
            if self._local is not _MISSING:   # the client has it: send it again
                new = self.client.scatter([(self._local, {"path": self.attrs.get("_path", "sklearn")})],
                                          hash=False)[0]
                inputs: list[Any] = []
            elif self.recipe is not None:
                new, inputs = self._rebuild()
            else:
                self.lost = True
                return None
        except Exception:  # noqa: BLE001 - the client closed, the inputs are gone too: lost
            self.lost = True
            return None
        self.rebuilds += 1
        self.key = new.key
        self._future = new
        _release_all(self._held)
        self._held[:] = [new, *inputs]
        return new

    def _rebuild(self) -> tuple[Any, list[Any]]:
        """Compute the state again from its recipe under new keys; (its future, the inputs sent again)."""
        recipe = self.recipe
        assert recipe is not None
        # keys never used before (Dask: a key names one task for its life; another task under an old key can
        # fail or deadlock): unique per rebuild, not per state, since states of one fit share upstream tasks
        sfx = f"-r{self.rebuilds + 1}-{uuid.uuid4().hex[:12]}"
        sent: list[Any] = []

        def arg(x: Any) -> Any:
            if isinstance(x, GraphKey):
                return x.name + sfx
            if isinstance(x, ClientValue):
                f = self.client.scatter([x.value], hash=False)[0]
                sent.append(f)
                return f
            if isinstance(x, StateInput):
                return _state_future(self.client, x.state, sent)
            return x

        dsk = {k + sfx: tuple(arg(e) for e in t) for k, t in recipe.tasks.items()}
        fut = self.client.get(dsk, recipe.root + sfx, sync=False)
        return fut, sent

    def release(self) -> None:
        """Drop the workers' copy (and the fit's inputs); a fetched copy stays usable, else the state is lost."""
        with self._lock:
            if self._released:
                return
            self._released = True
            self._future = None
            if self._local is _MISSING:
                self.lost = True
        self._finalizer()

    def fetch_and_release(self) -> None:
        """Fetch the estimator to the client (if the key is still there), then drop the workers' copy."""
        try:
            self.gather()
        except NotFittedError:
            pass
        self.release()

    def _lost_message(self) -> str:
        why = ("it was released when its Dask executor closed" if self._released
               else "it was lost on the Dask cluster (its worker died, or the client closed)")
        return (f"The fitted state of machine {self.label}, kept on a Dask worker ({self.key}), is no longer "
                f"available: {why}. Fit the network again: this machine retrains.")

    def __repr__(self) -> str:
        where = "fetched" if self.fetched else ("lost" if self.lost else "on the workers")
        return f"<DaskState {self.label} {self.key} {where}>"


def _state_future(client: Any, st: Any, sent: list[Any]) -> Any:
    """A future of an upstream state for a rebuild: its kept key (rebuilt if need be), else its estimator sent."""
    handle = st if isinstance(st, DaskState) else (st.stored if isinstance(st.stored, DaskState) else None)
    if handle is not None:
        fut = handle.future_on(client)
        if fut is not None:
            return fut
    if handle is not None and not hasattr(st, "path"):
        raise NotFittedError(handle._lost_message())
    f = client.scatter([(st.estimator, {"path": st.path})], hash=False)[0]
    sent.append(f)
    return f


def _on_recorded_device(est: Any, device: Any) -> Any:
    """``est`` with its GPU arrays on ``device``, where it was fitted.

    CuPy unpickles an array onto the *current* device of the thread that unpickles it, so a state fitted on
    GPU 1 and fetched by a client whose current device is 0 would arrive on GPU 0 while its record says
    ``cuda:1``: its arrays are moved back (one copy each, only those on another device).
    """
    if device is None or not str(device).startswith("cuda"):
        return est
    target = Device.parse(device)
    attrs = getattr(est, "__dict__", None)
    if not isinstance(attrs, dict):
        return est
    for name, value in list(attrs.items()):
        if is_cupy_array(value) and not same_device(device_of(value), target):
            attrs[name] = to_device(value, target)
    return est
