"""Dask clients and clusters for the dask executor: importing dask, finding, checking and closing clients.

``dask`` and ``distributed`` are imported only inside these functions (``pip install "gpunets[dask]"``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["require_distributed", "INSTALL_HINT"]

INSTALL_HINT = 'pip install "gpunets[dask]"'


def require_distributed() -> tuple[Any, Any]:
    """Import and return ``(dask, distributed)``, or raise an ImportError saying what to install.

    >>> dask, distributed = require_distributed()  # doctest: +SKIP
    """
    try:
        import dask
        import distributed
    except ImportError as e:
        msg = (f"The dask executor needs dask and distributed, which are not installed ({e}). "
               f"Install them with: {INSTALL_HINT}")
        raise ImportError(msg) from e
    return dask, distributed


def _worker_client() -> Any:
    """``distributed.worker_client()`` (not yet entered) inside a task on a worker, else None."""
    from distributed import get_worker, worker_client

    try:
        get_worker()
    except ValueError:
        return None
    return worker_client()


def _default_client() -> Any:
    """The current default ``distributed`` client, or None."""
    from distributed import default_client

    try:
        return default_client()
    except ValueError:
        return None


def _close(client: Any, cluster: Any) -> None:
    try:
        client.close()
    finally:
        if cluster is not None:
            cluster.close()


_ADDRESS_SCHEMES = ("tcp://", "tls://", "inproc://", "ucx://", "ws://", "wss://")


def _check_client(client: Any, distributed: Any) -> None:
    """A ``distributed.Client``, a scheduler address such as ``"tcp://10.0.0.5:8786"``, or None."""
    if client is None or isinstance(client, distributed.Client):
        return
    if isinstance(client, str) and client.startswith(_ADDRESS_SCHEMES) and len(client.split("://", 1)[1]) > 0:
        return
    what = f"the string {client!r}" if isinstance(client, str) else f"a {type(client).__name__}"
    msg = (f"DaskExecutor(client=...) got {what}: expected a distributed.Client, a scheduler address "
           f"starting with one of {list(_ADDRESS_SCHEMES)} (e.g. 'tcp://127.0.0.1:8786'), or None "
           "(the default client, else a LocalCluster started for the run). "
           "Pass the client itself: gn.DaskExecutor(distributed.Client(...)).")
    raise TypeError(msg)


def _address_of(client: Any) -> str:
    return client.scheduler.address


def _address_or_none(client: Any) -> str | None:
    """The scheduler's address, also for a closed client (from what it was made with); None if unknown."""
    try:
        return _address_of(client)
    except Exception:  # noqa: BLE001 - a closed client has no scheduler any more
        pass
    for where in (getattr(client, "_start_arg", None),   # Client("tcp://host:port"): the address it was given
                  getattr(getattr(client, "cluster", None), "scheduler_address", None),
                  (getattr(client, "_scheduler_identity", None) or {}).get("address"),
                  getattr(client, "scheduler_file", None)):
        if isinstance(where, str) and where:
            return where
    return None


def _check_security(security: Any, distributed: Any) -> None:
    """None or a ``distributed.Security``, else a TypeError at construction."""
    if security is None or isinstance(security, distributed.Security):
        return
    msg = (f"DaskExecutor(security=...) got a {type(security).__name__} ({security!r}): expected a "
           "distributed.Security or None. For TLS with a self-signed certificate made in memory: "
           "security=distributed.Security.temporary() (needs the cryptography package).")
    raise TypeError(msg)


_CLUSTERS = ("local", "cuda")


def _check_cluster(cluster: Any, rmm_pool_size: Any, distributed: Any) -> None:
    """``"local"``, ``"cuda"`` or a cluster object (``rmm_pool_size`` only with ``"cuda"``)."""
    from distributed.deploy import Cluster

    if isinstance(cluster, str):
        if cluster not in _CLUSTERS:
            msg = (f"DaskExecutor(cluster={cluster!r}): expected one of {list(_CLUSTERS)} or a cluster object "
                   "such as dask_cuda.LocalCUDACluster(...).")
            raise ValueError(msg)
    elif not isinstance(cluster, Cluster):
        msg = (f"DaskExecutor(cluster=...) got a {type(cluster).__name__}: expected 'local', 'cuda' or a "
               "distributed cluster object (LocalCluster, dask_cuda.LocalCUDACluster, ...).")
        raise TypeError(msg)
    if rmm_pool_size is not None and cluster != "cuda":
        msg = (f"DaskExecutor(rmm_pool_size={rmm_pool_size!r}) applies to the workers of cluster='cuda' only "
               "(a cluster you start yourself takes it: dask_cuda.LocalCUDACluster(rmm_pool_size=...)).")
        raise ValueError(msg)


def _import_dask_cuda() -> Any:
    """``dask_cuda.LocalCUDACluster``, or an ImportError saying what to install."""
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as e:
        msg = (f"DaskExecutor(cluster='cuda') starts a dask_cuda.LocalCUDACluster (one worker per GPU), but "
               f"dask-cuda is not importable ({e}). Install it with: pip install dask-cuda "
               "(with the RAPIDS packages of your CUDA version), or pass a client of your own cluster.")
        raise ImportError(msg) from e
    return LocalCUDACluster


def _check_open(client: Any, address: str | None = None) -> None:
    """A ConnectionError naming the scheduler (``address``, known from before) if ``client`` is closed."""
    if getattr(client, "status", "running") in ("closed", "closing", "closed-failed"):
        where = address or _address_or_none(client) or "an unknown address"
        msg = (f"DaskExecutor's client of the scheduler at {where} is closed ({client.status}); "
               "pass an open distributed.Client, or none (a cluster is started for the run).")
        raise ConnectionError(msg)
