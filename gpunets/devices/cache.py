"""A cache of node outputs on the training data (MLJ's ``cache=true``).

When only a downstream hyperparameter changes, a refit needs the same
upstream transforms of the same training data again.  A machine with
``cache=True`` (``gn.machine(model, X, y, cache=True)``, or every machine
with ``gn.set_config(cache=True)``) keeps the outputs of its operations on
the training data, so the next fit or call takes them from here instead of
recomputing them (and everything upstream of them that nothing else needs).

An entry's key is a digest of

* the fitted state's identity: a token of the fitted estimator object (never
  reused while the object lives) and the machine's version;
* the operation, the device the value was computed on and the frame kind;
* the identity of the inputs, made the same way recursively down to the
  sources, which contribute a :func:`~gpunets.devices.fingerprint.fingerprint` of
  their data and the rows selected.

So an entry is never stale: data changed in place, a retrain (a new fitted
estimator, a new version) or other rows give another key.  Each entry also
keeps the fingerprint of its value, checked when it is taken: a value
changed in place by its consumer is dropped, not served.

The store is bounded by ``gn.get_config()["cache_bytes"]`` (least recently
used entries are evicted first; a value larger than the budget is not kept),
measured with the values' ``nbytes``, and counted (:func:`cache_info`).  A
value stays where it was computed: on a GPU the cache holds the device array.
One lock guards it, so worker threads of the threads and streams executors
store into it safely.  Entries whose estimator is garbage-collected are
dropped.

>>> import numpy as np
>>> c = NodeCache()
>>> k = digest(b"example")
>>> c.put(k, np.ones(4), budget=1 << 20)
True
>>> float(c.get(k).sum()), c.info().hits, c.info().bytes
(4.0, 1, 32)
"""

from __future__ import annotations

import collections
import functools
import itertools
import sys
import threading
import types
import weakref
from collections.abc import Hashable
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from gpunets.base.config import get_config
from gpunets.devices.fingerprint import fingerprint

__all__ = ["NodeCache", "CacheInfo", "cache_info", "cache_clear", "digest", "token", "nbytes", "machine_caches",
           "CACHE"]


def digest(*parts: bytes) -> bytes:
    """A 128-bit digest of ``parts`` (lengths included, so parts never run into each other)."""
    h = blake2b(digest_size=16)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.digest()


# --- object identity tokens -------------------------------------------------------------------

_tokens = itertools.count(1)
_TOKENS: dict[int, tuple[Any, int]] = {}   # id(obj) -> (weak reference, token)
_TOKEN_LOCK = threading.Lock()


def token(obj: Any) -> int | None:
    """A number that names ``obj`` as long as it lives, never reused (None: it cannot be weakly referenced).

    >>> class A: pass
    >>> a = A()
    >>> token(a) == token(a), token(a) == token(A())
    (True, False)
    """
    i = id(obj)
    hit = _TOKENS.get(i)
    if hit is not None and hit[0]() is obj:
        return hit[1]
    with _TOKEN_LOCK:
        hit = _TOKENS.get(i)
        if hit is not None and hit[0]() is obj:
            return hit[1]
        t = next(_tokens)
        try:
            ref = weakref.ref(obj, _forget(i, t))
        except TypeError:
            return None
        _TOKENS[i] = (ref, t)
        return t


def _forget(i: int, t: int) -> Any:
    def gone(ref: Any) -> None:
        # no lock here: a collection can run this inside a locked section of the same thread
        hit = _TOKENS.get(i)
        if hit is not None and hit[1] == t:
            _TOKENS.pop(i, None)
        CACHE._dead.append(t)

    return gone


# --- sizes ------------------------------------------------------------------------------------

def nbytes(value: Any) -> int | None:
    """The bytes ``value`` holds (arrays, frames, sparse matrices, tuples of them); None when unknown.

    >>> import numpy as np
    >>> nbytes(np.zeros((2, 3))), nbytes((np.zeros(2), np.zeros(1))), nbytes(object())
    (48, 24, None)
    """
    if isinstance(value, (tuple, list)):
        total = 0
        for v in value:
            n = nbytes(v)
            if n is None:
                return None
            total += n
        return total
    usage = getattr(value, "memory_usage", None)
    if callable(usage) and hasattr(value, "columns"):   # pandas / cuDF frames
        try:
            return int(usage(index=True).sum())
        except Exception:  # noqa: BLE001 - an unusual frame: size unknown
            return None
    n = getattr(value, "nbytes", None)
    if isinstance(n, int):
        return n
    if hasattr(value, "indptr") and hasattr(value, "data"):   # scipy / cupyx sparse
        return int(value.data.nbytes + value.indices.nbytes + value.indptr.nbytes)
    try:
        return int(n) if n is not None else None
    except (TypeError, ValueError):
        return None


# --- the store --------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheInfo:
    """What the cache of node outputs holds and did (:func:`cache_info`)."""

    hits: int
    misses: int
    stores: int
    evictions: int
    entries: int
    bytes: int
    budget: int


@dataclass(eq=False)
class _Entry:
    value: Any
    size: int
    fp: Hashable
    token: int


class NodeCache:
    """A thread-safe, byte-bounded LRU map from cache keys (:func:`digest`) to node outputs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[bytes, _Entry] = collections.OrderedDict()
        self._by_token: dict[int, set[bytes]] = {}
        self._dead: collections.deque[int] = collections.deque()   # tokens of collected estimators
        self.bytes = 0
        self.hits = self.misses = self.stores = self.evictions = 0
        self.requested = False   # a machine with cache=True was fitted in this process (calls look here then)

    def get(self, key: bytes) -> Any:
        """The value stored under ``key`` (counted as a hit), else None (a miss).

        A value whose content changed since it was stored (a consumer wrote into it) is dropped: a miss.
        """
        with self._lock:
            self._purge()
            e = self._entries.get(key)
            if e is None:
                self.misses += 1
                return None
        if fingerprint(e.value) != e.fp:   # outside the lock: it reads the whole value
            with self._lock:
                if self._entries.get(key) is e:
                    self._drop(key)
                self.misses += 1
            return None
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
            self.hits += 1
        return e.value

    def put(self, key: bytes, value: Any, *, budget: int, owner: int = 0) -> bool:
        """Keep ``value`` under ``key``; False when it is not kept (size unknown or over ``budget``).

        ``owner`` is the token of the fitted estimator the key names: entries go when it is collected.
        """
        size = nbytes(value)
        if size is None or size > budget:
            return False
        fp = fingerprint(value)
        with self._lock:
            self._purge()
            if key in self._entries:
                self._drop(key)
            self._entries[key] = _Entry(value, size, fp, owner)
            self._by_token.setdefault(owner, set()).add(key)
            self.bytes += size
            self.stores += 1
            self._evict(budget)
        return True

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        with self._lock:
            self._entries.clear()
            self._by_token.clear()
            self.bytes = 0
            self.hits = self.misses = self.stores = self.evictions = 0

    def info(self) -> CacheInfo:
        with self._lock:
            self._purge()
            return CacheInfo(self.hits, self.misses, self.stores, self.evictions, len(self._entries), self.bytes,
                             int(get_config()["cache_bytes"]))

    # --- under the lock ------------------------------------------------------------------------
    def _drop(self, key: bytes) -> None:
        e = self._entries.pop(key)
        self.bytes -= e.size
        keys = self._by_token.get(e.token)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_token[e.token]

    def _evict(self, budget: int) -> None:
        while self.bytes > budget and self._entries:
            self._drop(next(iter(self._entries)))
            self.evictions += 1

    def _purge(self) -> None:
        while self._dead:
            t = self._dead.popleft()
            for key in list(self._by_token.get(t, ())):
                self._drop(key)


#: The process-wide cache of node outputs.
CACHE = NodeCache()


def cache_info() -> CacheInfo:
    """Hits, misses, stores, evictions, entries and bytes of the node-output cache, and its budget.

    >>> import gpunets as gn
    >>> info = gn.cache_info()
    >>> info.bytes <= info.budget
    True
    """
    return CACHE.info()


def cache_clear() -> None:
    """Empty the node-output cache and reset its counters.

    >>> import gpunets as gn
    >>> gn.cache_clear(); gn.cache_info().entries
    0
    """
    CACHE.clear()


def machine_caches(m: Any) -> bool:
    """Whether machine ``m`` keeps its outputs: its own ``cache=``, else ``gn.get_config()["cache"]``."""
    own = getattr(m, "cache", None)
    return bool(get_config()["cache"]) if own is None else bool(own)


# --- keys -------------------------------------------------------------------------------------

def value_key(x: Any) -> bytes:
    """The identity of a constant or of data: its content fingerprint."""
    return repr(fingerprint(x)).encode()


def operation_key(f: Any) -> bytes | None:
    """The identity of a node's operation; None when it cannot be named (then nothing below is keyed).

    An operation name is itself; a ``functools.partial`` its function and arguments; a function with no
    closure its code and defaults (so a lambda rebuilt by a composite's ``network`` names the same
    operation); anything else the object (a token, valid while it lives).
    """
    if isinstance(f, str):
        return b"op:" + f.encode()
    if isinstance(f, functools.partial):
        inner = operation_key(f.func)
        if inner is None:
            return None
        return digest(b"partial", inner, value_key((f.args, sorted(f.keywords.items()))))
    name = _global_name(f)
    if name is not None:
        return b"global:" + name.encode()
    if isinstance(f, types.FunctionType) and not f.__closure__:
        t = token(f.__code__)
        if t is not None:
            return digest(b"code", str(t).encode(), value_key((f.__defaults__, f.__kwdefaults__)))
    t = token(f)
    return None if t is None else b"obj:" + str(t).encode()


def _global_name(f: Any) -> str | None:
    """``module:qualname`` when ``f`` is the object that name holds (``np.log``, ``operator.add``), else None."""
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None)
    if not isinstance(name, str) or "<" in name:
        return None
    for mod in (getattr(f, "__module__", None), type(f).__module__):
        obj = sys.modules.get(mod) if isinstance(mod, str) else None
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is f:
            return f"{mod}:{name}"
    return None
