"""Fitted states that stay on the Dask workers: a machine's estimator, held there by a key, fetched on demand.

After a fit on a cluster that outlives the run, a machine's state is a :class:`DaskState`: a future of the
key ``gpunets-state-<machine>-v<version>-<run>`` (the fitted estimator and its path, on the worker that
fitted it) and the small attributes a report needs.  The key changes only when the machine retrains.
Evaluations add the future to their graph as a dependency, so only new data and small task descriptions
travel.  The client fetches the estimator only when asked (``mach.estimator_``, ``fitted_params``,
``report`` of a composite's components, pickling, ``gn.save``, another executor).

The key is released when the machine retrains (:meth:`release`), when the state is garbage collected
(a ``weakref.finalize``) or when the executor that made it closes (it fetches the estimator first, so the
machine stays usable).  A worker that dies with the key: Dask recomputes it from the fit's inputs, which
the state keeps on the cluster; if those died too, the client's copy is sent again when there is one,
else the state is *lost* (the machine retrains on its next fit, and an evaluation says so).

No dask import here: the futures are used through their methods.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..exceptions import NotFittedError
from ..machines import RemoteEstimator

__all__ = ["DaskState", "SUMMARY_ATTRIBUTES"]

#: The attributes of a fitted estimator that come back with every fit (small, needed by reports and refits).
SUMMARY_ATTRIBUTES = ("report_", "fit_report_", "_gn_incremental")

_MISSING = object()


def _release_all(futures: list[Any]) -> None:
    for f in futures:
        try:
            f.release()
        except Exception:  # noqa: BLE001, S110 - its client already closed: nothing is held any more
            pass


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
    """

    def __init__(self, label: str, client: Any, future: Any, attrs: dict[str, Any], inputs: list[Any],
                 timeout: float | None = None) -> None:
        self.label = label
        self.client = client
        self.key = future.key
        self.attrs = attrs
        self.timeout = timeout
        self._lock = threading.Lock()
        self._future: Any = future
        self._local: Any = _MISSING
        self._released = False
        self.lost = False
        held = [future, *inputs]
        self._finalizer = weakref.finalize(self, _release_all, held)

    # --- the client's view --------------------------------------------------------------
    def gather(self) -> Any:
        """The fitted estimator, fetched from its worker the first time (thread-safe)."""
        with self._lock:
            if self._local is not _MISSING:
                return self._local
            fut = self._future
            if fut is None or self.lost:
                raise NotFittedError(self._lost_message())
            try:
                est = fut.result(timeout=self.timeout)[0]
            except Exception as e:  # noqa: BLE001 - a lost key, a closed client: one message
                self.lost = True
                msg = f"{self._lost_message()} ({type(e).__name__}: {e})"
                raise NotFittedError(msg) from e
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
        """The key's future if it is usable on ``client`` (same client, still held, not lost), else None."""
        fut = self._future
        if fut is None or self.lost or client is not self.client or fut.status in ("error", "cancelled", "lost"):
            return None
        return fut

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
        why = ("it was released when its Dask executor closed or the machine retrained" if self._released
               else "it was lost on the Dask cluster (its worker died, or the client closed)")
        return (f"The fitted state of machine {self.label}, kept on a Dask worker ({self.key}), is no longer "
                f"available: {why}. Fit the network again: this machine retrains.")

    def __repr__(self) -> str:
        where = "fetched" if self.fetched else ("lost" if self.lost else "on the workers")
        return f"<DaskState {self.label} {self.key} {where}>"
