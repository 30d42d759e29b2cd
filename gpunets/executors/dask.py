"""Run a plan on a Dask cluster: the plan is lowered to one Dask graph and Dask schedules it.

How a run goes (:meth:`DaskExecutor.run`):

1. A plan with nothing to run (every machine skips) returns at once: no
   cluster is started, contacted or sent anything.
2. Every task function is pickled on the client with cloudpickle.  A task
   that cannot be pickled (a model holding a lock, an open file, ...) fails
   the run with an error naming its machine or node, *before anything is sent*.
3. The source values the plan reads are scattered to the workers in one
   ``client.scatter`` call: once per run, never embedded in a task.
4. The tasks become one graph, submitted with one ``client.get(...,
   sync=False)``: dependencies are Dask keys, so intermediate values stay on
   the workers and move between them only when a consumer runs elsewhere.
   Tasks on ``cuda:N`` are restricted to the worker that owns GPU ``N``
   (see :func:`gpu_owners`); the others may run anywhere.
5. Only what the client needs comes back: each fit's ``(fitted estimator,
   info)`` (committed on the client as soon as it arrives, so machines that
   finished keep their state if a later task fails) and the requested outputs.
6. The run's trace comes from Dask's own diagnostics: the scheduler's task
   stream (``client.get_task_stream``), one record per task, one lane per worker.

Faults: a task that raises is retried ``retries`` times by Dask; a worker that
dies while running a task makes the scheduler run it on another worker, up to
the scheduler's ``distributed.scheduler.allowed-failures`` (set to
``retries`` on a cluster this executor starts), then the run fails with an
error naming the task.  ``timeout`` bounds a run; on expiry the outstanding
work is released and the run fails naming the unfinished tasks.  A run only ever
releases its own keys (never ``client.cancel``), so a failure leaves the user's
other futures on the same client untouched and no key of the run behind.

``dask`` and ``distributed`` are imported only in this module and
:mod:`~gpunets.executors._dask_cluster`, and only when an executor is created
(``pip install "gpunets[dask]"``).  This module lowers a plan to a Dask graph
and runs it; ``_dask_cluster.py`` finds, checks and closes clients and
clusters; ``_dask_worker.py`` holds what runs on the workers (tasks, GPU
pinning, timings).
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from gpunets.base.exceptions import NotFittedError
from gpunets.compute.estimators import under_sklearn_config
from gpunets.devices.store import current_store
from gpunets.executors import _dask_lower as _lower
from gpunets.executors._args import check_flag, check_mapping, check_seconds
from gpunets.executors._dask_cluster import (
    INSTALL_HINT,
    _address_of,
    _address_or_none,
    _check_client,
    _check_cluster,
    _check_open,
    _check_security,
    _close,
    _default_client,
    _import_dask_cuda,
    _worker_client,
    require_distributed,
)
from gpunets.executors._dask_lower import (
    _applies_state,
    _cuda_index,
    _describe,
    _record_task_stream,
    _register_atexit,
    _release,
    _RunContext,
    _set_error,
)
from gpunets.executors._dask_state import DaskState
from gpunets.executors._dask_store import in_store, shared, worker_functions
from gpunets.executors._dask_worker import gpu_owners
from gpunets.executors.base import Executor
from gpunets.executors.scheduler import Run
from gpunets.planning.plan import _apply_fitted

__all__ = ["DaskExecutor", "gpu_owners", "require_distributed", "INSTALL_HINT"]


# --------------------------------------------------------------------------------------------
# The executor
# --------------------------------------------------------------------------------------------
class DaskExecutor(Executor):
    """Run plans on a Dask cluster (``dask.distributed``).

    Parameters
    ----------
    client : distributed.Client or str, optional
        The cluster to use; never closed by this executor.  A scheduler
        address (``"tcp://host:8786"``) connects on first use (the default
        client if it is connected there); a pickled executor carries its
        client's address, not the live client.  Without one, a
        run inside a task on a Dask worker (a composite or stacking model with
        ``executor="dask"`` fitted by an outer Dask run) uses that worker's
        client and secedes from its thread pool while it waits; any other run
        uses the current default client (``distributed.default_client()``) if
        there is one (with ``cluster="local"``), else the cluster ``cluster=``
        names, started by this executor.
    workers : int, optional
        Worker processes of a ``LocalCluster`` this executor starts (default 2,
        one thread each).  Ignored with a client.
    retries : int
        How many times a failing task is retried (Dask's ``retries``), and, on
        a cluster this executor starts, how many times a task whose worker died
        is run again elsewhere (``distributed.scheduler.allowed-failures``).
    timeout : float, optional
        Seconds a run may take before its outstanding tasks are released and
        it fails naming them (default: no limit).
    keep_cluster : bool
        Keep a ``LocalCluster`` this executor starts until :meth:`close` (or
        the end of a ``with`` block, or interpreter exit) instead of closing it
        at the end of each run.  Entering ``with DaskExecutor() as ex:`` keeps it.
    trace : bool
        Record the run's trace from Dask's task stream (the scheduler's
        ``TaskStreamPlugin``, read once per run).
    cluster_kwargs : dict, optional
        Extra keyword arguments for the cluster it starts.
    security : distributed.Security, optional
        TLS settings: for a cluster this executor starts (which then speaks
        ``tls://``; ``distributed.Security.temporary()`` makes a self-signed
        one in memory, needs ``cryptography``) and for connecting to a
        scheduler address.  A cluster it starts listens on 127.0.0.1 only,
        dashboard included, with or without it.
    cluster : {"local", "cuda"} or distributed cluster, optional
        What to start when there is no client: ``"local"`` (default) a
        ``distributed.LocalCluster`` of ``workers`` processes; ``"cuda"`` a
        ``dask_cuda.LocalCUDACluster``, one worker per GPU (``pip install
        dask-cuda``).  A cluster object (e.g. a ``LocalCUDACluster`` you
        started) is used through a client this executor makes and never closed.
        A task placed on ``cuda:N`` runs on the worker that owns GPU ``N``.
    rmm_pool_size : int or str, optional
        With ``cluster="cuda"``: each worker's RMM pool (``"8GB"``), passed to
        ``LocalCUDACluster``.

    Raises
    ------
    ImportError
        If dask or distributed is not installed (``pip install "gpunets[dask]"``),
        or ``cluster="cuda"`` without dask-cuda (at the first run).
    TypeError
        If ``security`` is not a ``distributed.Security``, or ``cluster`` is
        neither a name nor a cluster.

    Examples
    --------
    >>> from dask.distributed import Client, LocalCluster     # doctest: +SKIP
    >>> client = Client(LocalCluster(n_workers=2, threads_per_worker=1))  # doctest: +SKIP
    >>> report = yhat.fit(executor=gn.DaskExecutor(client))  # doctest: +SKIP
    >>> yhat(X_test, executor="dask")                         # doctest: +SKIP
    """

    name = "dask"

    def __init__(self, client: Any = None, *, workers: int | None = None, retries: int = 1,
                 timeout: float | None = None, keep_cluster: bool = False, trace: bool = True,
                 cluster_kwargs: dict[str, Any] | None = None, security: Any = None, cluster: Any = "local",
                 rmm_pool_size: Any = None) -> None:
        _, distributed = require_distributed()
        owner = "DaskExecutor"
        _check_client(client, distributed)
        _check_security(security, distributed)
        _check_cluster(cluster, rmm_pool_size, distributed)
        super().__init__(workers)
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            msg = f"retries={retries!r} must be an integer >= 0."
            raise ValueError(msg)
        check_seconds("timeout", timeout, owner, "no limit")
        check_flag("keep_cluster", keep_cluster, owner)
        check_flag("trace", trace, owner)
        cluster_kwargs = check_mapping("cluster_kwargs", cluster_kwargs, owner, "LocalCluster arguments")
        self.client = client
        self.workers = workers or 2
        self.retries = retries
        self.timeout = timeout
        self.keep_cluster = keep_cluster
        self.trace = trace
        self.cluster_kwargs = cluster_kwargs
        self.security = security
        self._address = (_address_or_none(client) if client is not None and not isinstance(client, str)
                         else None)
        self.cluster = cluster
        self.rmm_pool_size = rmm_pool_size
        self._gpu_map: tuple[Any, frozenset[str], dict[int, tuple[list[str], int]]] | None = None
        self._own: tuple[Any, Any] | None = None     # (client, cluster) started here and kept
        self._own_lock = threading.Lock()
        self._states: weakref.WeakSet[DaskState] = weakref.WeakSet()   # fitted states kept on the workers
        self._sent: dict[int, tuple[Any, Any]] = {}   # id(local fitted state) -> (client, its scattered future)
        self.last_cluster: Any = None                # the cluster of the last run started here (tests)

    # --- the cluster ----------------------------------------------------------------------
    def _start_cluster(self) -> tuple[Any, Any]:
        """A client of a new cluster (``cluster=``), listening on the loopback interface only.

        Returns ``(client, cluster)``; the cluster is None for a cluster object given to the
        executor (it is not this executor's to close).
        """
        dask, distributed = require_distributed()
        if not isinstance(self.cluster, str):
            return distributed.Client(self.cluster, set_as_default=False), None
        # loopback only: the scheduler, the workers and the dashboard (":0" alone binds every interface)
        kw: dict[str, Any] = {"threads_per_worker": 1, "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}
        if self.security is not None:
            kw["security"] = self.security        # LocalCluster then speaks tls://
        if self.cluster == "cuda":
            cuda_cluster = _import_dask_cuda()
            if self.rmm_pool_size is not None:
                kw["rmm_pool_size"] = self.rmm_pool_size
            kw.update(self.cluster_kwargs)
            factory = cuda_cluster
        else:
            kw.update({"n_workers": self.workers, "processes": True})
            kw.update(self.cluster_kwargs)
            factory = distributed.LocalCluster
        with dask.config.set({"distributed.scheduler.allowed-failures": self.retries}):
            cluster = factory(**kw)
            client = distributed.Client(cluster, set_as_default=False, security=self.security)
        self.last_cluster = cluster
        return client, cluster

    def _acquire(self) -> tuple[Any, Callable[[], None] | None, bool]:
        """The client for a run; for a cluster started just for it, how to close it; whether the
        cluster outlives the run (then fitted states stay on the workers)."""
        if self.client is not None and not isinstance(self.client, str):
            _check_open(self.client, self._address)
            return self.client, None, True
        with self._own_lock:
            if self._own is not None:
                return self._own[0], None, True
        nested = _worker_client()
        if isinstance(self.client, str) and nested is None:
            return self._connect(self.client), None, True
        if nested is not None:
            # a run inside a task on a Dask worker (a composite or stacking model fitted with
            # executor="dask" by an outer Dask run): use the worker's client and secede from its
            # thread pool while waiting, so the inner tasks can run even with one thread per worker
            # (never start a cluster from a worker: its daemon processes cannot have children).
            # Its fitted states come back with the outer task's value: they are not kept here.
            client = nested.__enter__()
            return client, lambda: nested.__exit__(None, None, None), False
        current = _default_client() if self.cluster == "local" else None   # "cuda" or a cluster: that one
        if current is not None:
            return current, None, True
        client, cluster = self._start_cluster()
        if self.keep_cluster or cluster is None:
            with self._own_lock:
                self._own = (client, cluster)
            _register_atexit(self)
            return client, None, True
        return client, lambda: _close(client, cluster), False

    def _connect(self, address: str) -> Any:
        """A client of the scheduler at ``address``: the default client if it is one, else a new one kept."""
        current = _default_client()
        if current is not None and _address_of(current) == address:
            return current
        dask, distributed = require_distributed()
        with self._own_lock:
            if self._own is None:
                limit = self.timeout if self.timeout is not None else dask.config.get(
                    "distributed.comm.timeouts.connect")
                try:
                    client = distributed.Client(address, set_as_default=False, timeout=limit,
                                                security=self.security)
                except (OSError, TimeoutError) as e:
                    msg = (f"DaskExecutor could not reach the Dask scheduler at {address} within {limit}{' s' if isinstance(limit, (int, float)) else ''} "
                           f"({type(e).__name__}: {e}). Check the address and that the scheduler runs and "
                           "listens there (a TLS scheduler needs tls:// and security=...).")
                    raise ConnectionError(msg) from e
                self._own = (client, None)
                _register_atexit(self)
            return self._own[0]

    def _constructor_args(self, for_pickle: bool) -> dict[str, Any]:
        named = super()._constructor_args(for_pickle)
        client = named.get("client")
        if for_pickle and client is not None and not isinstance(client, str):
            named["client"] = _address_of(client)   # the live client cannot travel: its scheduler's address does
        cluster = named.get("cluster")
        if for_pickle and cluster is not None and not isinstance(cluster, str):
            named["cluster"] = "local"                # a live cluster cannot travel either: its address does
            if named.get("client") is None:
                named["client"] = cluster.scheduler_address
        if not for_pickle and client is None:
            with self._own_lock:
                own = self._own
            if own is not None:   # a copy (e.g. clone in a grid search) uses the cluster this one keeps
                named["client"] = own[0]
        return named

    def _shared_args(self) -> tuple[str, ...]:
        return ("client", "cluster", "security")   # a copy uses the same cluster

    def close(self) -> None:
        """Release what this executor keeps on the cluster, and close the ``LocalCluster`` it started and kept.

        Fitted states kept on the workers are fetched to their machines first, so they stay usable.
        A client it was given is never closed.
        """
        with self._own_lock:
            own, self._own = self._own, None
            states, self._states = list(self._states), weakref.WeakSet()
            sent, self._sent = list(self._sent.values()), {}
        for st in states:
            st.fetch_and_release()
        _release(f for _, f in sent)
        if own is not None:
            _close(*own)

    def __enter__(self) -> DaskExecutor:
        self.keep_cluster = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = ("client" if self.client is not None and not isinstance(self.client, str)
                 else repr(self.client) if self.client is not None else f"LocalCluster(n_workers={self.workers})")
        return f"DaskExecutor({where}, retries={self.retries})"

    # --- a run ----------------------------------------------------------------------------
    def run(self, plan: Any, on_task_done: Any = None) -> Run:
        """Run ``plan`` on the cluster and return the finished :class:`~gpunets.executors.scheduler.Run`."""
        run = Run(plan, executor_name=self.name, on_task_done=on_task_done)
        tasks = [t for t in plan.tasks if t.kind != "source"]
        if not tasks:
            return run   # nothing to do: the cluster is not touched
        states = {t.key: t.fn.args[2] for t in tasks if _applies_state(t.fn)}
        payloads = self._pickle_tasks(run, tasks, states)
        if payloads is None:
            return run   # a task cannot be pickled: nothing was sent
        client, closer, persistent = self._acquire()
        try:
            store = current_store()
            swap = worker_functions(tasks, store) if store is not None else {}
            if store is not None and shared(client, store):   # the workers read and write the store: keys, not states
                more = self._pickle_tasks(run, [t for t in tasks if t.key in swap], states, swap) if swap else {}
                if more is None:
                    return run
                payloads.update(more)
                payloads = in_store(store, payloads)   # and each task runs under it, as on the other executors
            self._drive(client, run, tasks, payloads, states, persistent)
        finally:
            if closer is not None:
                closer()
        return run

    def _pickle_tasks(self, run: Run, tasks: list[Any], states: dict[int, Any],
                      swap: dict[int, Any] | None = None) -> dict[int, bytes] | None:
        """Each task's function (or its replacement in ``swap``), pickled; one that applies a fitted state gets
        the state as its last input (a key on the cluster, see :meth:`_state_refs`), so the estimator never
        travels in the graph."""
        import cloudpickle

        payloads: dict[int, bytes] = {}
        for t in tasks:
            fn = t.fn if swap is None else swap[t.key]
            if t.key in states:
                fn = partial(_apply_fitted, fn.args[0], fn.args[1])
            if run.sklearn_config:   # scikit-learn's configuration is per thread: the caller's goes along
                fn = partial(under_sklearn_config, run.sklearn_config, fn)
            try:
                payloads[t.key] = cloudpickle.dumps(fn)
            except Exception as e:  # noqa: BLE001 - any pickling failure, reported naming the task
                what = _describe(t)
                model = ""
                if t.machine is not None:
                    model = f" (its model {type(t.machine.model).__name__}, or the fitted estimator)"
                msg = (f"{what} cannot be sent to the Dask workers: it cannot be pickled{model} "
                       f"({type(e).__name__}: {e}). Nothing was sent to the cluster. Make it picklable "
                       "(no locks, open files or connections in its attributes) or use a local executor "
                       "such as executor=\"threads\".")
                _set_error(run, t.key, msg, e)
                return None
        return payloads

    def _state_refs(self, client: Any, run: Run, states: dict[int, Any]) -> dict[int, Any] | None:
        """For each task applying a fitted state, the future of that state on ``client``'s cluster.

        A state fitted on this cluster is its key there; any other (fitted locally, or on another
        client) is scattered once and the future kept until the state is dropped or the executor
        closes.  None (the run failed, naming the task) if a kept state was lost and no copy is left.
        """
        import cloudpickle

        refs: dict[int, Any] = {}
        send: dict[int, Any] = {}
        for k, st in states.items():
            fut = st.stored.future_on(client) if st.is_remote else None
            if fut is None:
                fut = self._sent_before(client, st)
            if fut is None:
                send[k] = st
            else:
                refs[k] = fut
        for k, st in send.items():   # every state to send is checked before the first one is sent
            task = run.plan.tasks[k]
            try:
                cloudpickle.dumps(st.estimator)
            except NotFittedError as e:
                _set_error(run, k, f"{_describe(task)} cannot be evaluated: {e}", e)
                return None
            except Exception as e:  # noqa: BLE001 - any pickling failure, reported naming the task
                msg = (f"{_describe(task)} cannot be sent to the Dask workers: its fitted estimator "
                       f"{type(st.estimator).__name__} cannot be pickled ({type(e).__name__}: {e}). Nothing was "
                       "sent to the cluster. Make it picklable (no locks, open files or connections in its "
                       "attributes) or use a local executor such as executor=\"threads\".")
                _set_error(run, k, msg, e)
                return None
        for k, st in send.items():
            refs[k] = self._send_state(client, st)
        return refs

    def _sent_before(self, client: Any, st: Any) -> Any:
        """The future of local state ``st`` scattered to ``client``'s cluster before, if still there."""
        with self._own_lock:
            got = self._sent.get(id(st))
        if got is not None and got[0] is client and got[1].status not in ("error", "cancelled", "lost"):
            return got[1]
        return None

    def _send_state(self, client: Any, st: Any) -> Any:
        """Scatter fitted state ``st`` to ``client``'s cluster once (the future is kept)."""
        got = self._sent_before(client, st)
        if got is not None:
            return got
        value = (st.estimator, {"path": st.path})
        fut = client.scatter([value], hash=False)[0]
        with self._own_lock:
            old = self._sent.get(id(st))
            self._sent[id(st)] = (client, fut)
        if old is not None:
            _release([old[1]])
        else:
            weakref.finalize(st, self._forget_sent, weakref.ref(self), id(st))
        return fut

    @staticmethod
    def _forget_sent(ref: Any, ident: int) -> None:
        ex = ref()
        if ex is None:
            return
        with ex._own_lock:
            got = ex._sent.pop(ident, None)
        if got is not None:
            _release([got[1]])

    def _drive(self, client: Any, run: Run, tasks: list[Any], payloads: dict[int, bytes],
               states: dict[int, Any], persistent: bool) -> None:
        _, distributed = require_distributed()
        plan = run.plan
        run_id = uuid.uuid4().hex[:12]
        t0_wall = time.time() - (time.perf_counter() - run.t0)
        wanted = [k for k in dict.fromkeys([t.key for t in tasks if t.kind == "fit"] + list(plan.outputs))
                  if plan.tasks[k].kind != "source"]
        restrict = self._placement(client, tasks)
        if isinstance(restrict, str):
            bad = next(t for t in tasks if _cuda_index(t) is not None)
            _set_error(run, bad.key, restrict, ValueError(restrict))
            return
        ctx = _RunContext(states, persistent)
        finished: set[int] = set()       # wanted keys whose values are on the client
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        resumes = max(1, self.retries)
        attempt = 0
        submitted = False
        try:
            while True:
                refs = self._state_refs(client, run, states)   # each attempt: a lost state is rebuilt first
                if refs is None:
                    break
                ctx.state_refs = refs
                if self.trace and not submitted:
                    _record_task_stream(client)
                submitted = True
                lost = self._submit_and_collect(client, distributed, run, f"{run_id}{attempt or ''}", wanted,
                                                finished, restrict, payloads, deadline, ctx)
                if not lost or run.error is not None:
                    break
                attempt += 1
                if attempt > resumes:
                    k = next(k for k in wanted if k not in finished)
                    msg = (f"{_describe(plan.tasks[k])} could not be computed on Dask: workers died while "
                           f"running it or holding its inputs, {attempt} times (a crash or a killed process, "
                           f"e.g. out of memory); gave up after {resumes} resubmission(s) (retries={self.retries}).")
                    _set_error(run, k, msg, RuntimeError(msg))
                    break
        finally:
            if self.trace and submitted:
                self._collect_trace(client, run, run_id, t0_wall)
        if run.error is None:
            for t in tasks:   # intermediates: done, their values stayed on the workers
                if t.key not in finished and run.claim(t.key):
                    run.complete(t.key, None)

    _submit_and_collect = _lower.submit_and_collect   # in _dask_lower: (executor, ...)

    _placement = _lower.placement   # in _dask_lower: (executor, ...)

    _gpu_map_of = _lower.gpu_map_of   # in _dask_lower: (executor, ...)

    _collect_trace = _lower.collect_trace   # in _dask_lower: (executor, ...)
