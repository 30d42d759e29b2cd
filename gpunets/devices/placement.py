"""Where work runs: the :class:`Device` value, GPU detection, and placement blocks.

Placement of a node or machine is decided in this order (first that applies):

0. an :class:`override_placement` block in force (``gn.fit(..., device=...)``) wins over all;
1. an explicit ``device=`` given when the node or machine is built;
2. the innermost ``with gn.device(...)`` block around the code that built it;
3. the configured default, ``gn.get_config()["device"]``.

``"auto"`` (or ``None``) at any level means "no preference here": the next level
decides, and at the bottom ``"auto"`` is ``cuda:0`` when a GPU is usable here
(:func:`gpu_available`) and ``cpu`` otherwise.

Nothing here imports CuPy at import time; :func:`gpu_available` imports it on
first call (cached) and never raises.

>>> Device.parse("cuda") == Device.parse("cuda:0")
True
>>> with device("cpu"):
...     resolve(None)
Device('cpu')
"""

from __future__ import annotations

import contextvars
import functools
import re
from dataclasses import dataclass
from typing import Any

from gpunets.base._warn import fallback_owner, warn_once, warn_user
from gpunets.base.config import get_config
from gpunets.base.exceptions import DeviceUnavailableError
from gpunets.devices import _gpulibs

__all__ = [
    "Device",
    "DeviceFallbackWarning",
    "CPU",
    "gpu_available",
    "gpu_count",
    "resolve",
    "device",
    "current_placement",
    "override_placement",
    "placement_override",
    "device_exists",
    "why_unavailable",
    "check_available",
    "local_ordinal",
    "physical_index",
    "same_device",
    "host_only",
    "is_host_only",
]

_VALID_FORMS = "'cpu', 'cuda', 'cuda:N' (N >= 0), or 'auto'"
_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")


class DeviceFallbackWarning(UserWarning):
    """Work placed on a GPU that does not exist here runs on the CPU instead."""


@dataclass(frozen=True)
class Device:
    """A place where arrays live and work runs: the CPU or one CUDA GPU.

    A frozen, hashable value.  ``Device("cuda")`` is ``cuda:0``; a string with an
    index (``Device("cuda:1")``) is parsed.

    Parameters
    ----------
    kind : {"cpu", "cuda"} or str
        The kind of device, or a full spec such as ``"cuda:1"``.
    index : int, optional
        The GPU ordinal; ``None`` for the CPU, ``0`` by default for CUDA.

    Examples
    --------
    >>> Device("cuda", 1)
    Device('cuda:1')
    >>> str(Device("cuda")), Device("cpu").is_cpu
    ('cuda:0', True)
    >>> {Device("cuda"), Device.parse("cuda:0")} == {Device("cuda", 0)}
    True
    """

    kind: str
    index: int | None = None

    def __post_init__(self) -> None:
        kind, index = self.kind, self.index
        if isinstance(kind, str) and ":" in kind and index is None:
            parsed = Device.parse(kind)
            kind, index = parsed.kind, parsed.index
        if kind == "cpu":
            if index is not None:
                raise ValueError(f"Device('cpu') takes no index (got {index!r}); use Device('cpu').")
        elif kind == "cuda":
            index = 0 if index is None else index
            if not isinstance(index, int) or isinstance(index, bool) or index < 0:
                raise ValueError(f"Invalid CUDA device index {index!r}: expected an int >= 0, "
                                 f"as in Device('cuda', 1) or 'cuda:1'.")
        else:
            raise ValueError(f"Invalid device kind {kind!r}: expected {_VALID_FORMS}.")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "index", index)

    @staticmethod
    def parse(spec: Any) -> Device:
        """Parse a device spec: a :class:`Device`, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``.

        ``"auto"`` is the automatic device (``cuda:0`` if :func:`gpu_available`,
        else ``cpu``); use :func:`resolve` to honour ``gn.device`` blocks and the
        configured default.  String specs are parsed once and cached.

        Raises
        ------
        ValueError
            For anything else, listing the valid forms.

        Examples
        --------
        >>> Device.parse(" CUDA:2 ")
        Device('cuda:2')
        >>> Device.parse("tpu")
        Traceback (most recent call last):
        ...
        ValueError: Invalid device 'tpu': expected 'cpu', 'cuda', 'cuda:N' (N >= 0), or 'auto'.
        """
        if isinstance(spec, Device):
            return spec
        if isinstance(spec, str):
            if spec.strip().lower() == "auto":
                return _auto_device()
            return _parse_str(spec)
        msg = f"Invalid device {spec!r} (a {type(spec).__name__}): expected {_VALID_FORMS}."
        if isinstance(spec, int) and not isinstance(spec, bool):
            msg += f" For GPU number {spec}, write 'cuda:{spec}'."
        raise ValueError(msg)

    @property
    def is_cuda(self) -> bool:
        """True for a CUDA GPU.

        >>> Device("cuda:3").is_cuda
        True
        """
        return self.kind == "cuda"

    @property
    def is_cpu(self) -> bool:
        """True for the CPU.

        >>> Device("cpu").is_cpu
        True
        """
        return self.kind == "cpu"

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    def __repr__(self) -> str:
        return f"Device({str(self)!r})"


CPU = Device("cpu")


@functools.lru_cache(maxsize=256)
def _parse_str(spec: str) -> Device:
    text = spec.strip().lower()
    if text == "cpu":
        return CPU
    match = _CUDA_RE.match(text)
    if match:
        return Device("cuda", int(match.group(1) or 0))
    msg = f"Invalid device {spec!r}: expected {_VALID_FORMS}."
    if text in ("gpu", "cuda:-1") or text.startswith("gpu:"):
        msg += " GPUs are written 'cuda' or 'cuda:N' with N >= 0."
    raise ValueError(msg)


# ----------------------------------------------------------------- detection


_HIDDEN = [0]   # gpunets.testing.no_gpu() blocks open: inside them gpunets sees no GPU, even where one is


def _probe() -> tuple[bool, int, str]:
    """The probe's answer, or no GPU inside a ``gpunets.testing.no_gpu()`` block."""
    if _HIDDEN[0]:
        return False, 0, "the GPUs are hidden by gpunets.testing.no_gpu()"
    return _gpu_probe()


@functools.lru_cache(maxsize=1)
def _gpu_probe() -> tuple[bool, int, str]:
    """(usable, count, why-not) for this process; cached, never raises."""
    _gpulibs.fake_gpu_count()  # a bad GPUNETS_FAKE_GPU is an error, not "no GPU"
    try:
        cupy = _gpulibs.cupy()  # the real CuPy, or the fake GPU of gpunets.devices.fakegpu; imported lazily
    except Exception as exc:  # ImportError, or a broken CUDA install
        return False, 0, f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        is_available = getattr(cupy.cuda, "is_available", None) or cupy.is_available
        if not is_available():
            return False, 0, "cupy.cuda.is_available() is False (no GPU or driver visible)"
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        return False, 0, f"the CUDA runtime could not be queried ({type(exc).__name__}: {exc})"
    return count > 0, count, "" if count > 0 else "no CUDA device is visible"


def gpu_available() -> bool:
    """Whether a CUDA GPU is usable here: False if CuPy is not importable.

    Cheap after the first call (cached) and never raises.

    >>> isinstance(gpu_available(), bool)
    True
    """
    return _probe()[0]


def gpu_count() -> int:
    """The number of CUDA GPUs usable here (0 without CuPy or a GPU).

    >>> gpu_count() >= 0
    True
    """
    return _probe()[1] if gpu_available() else 0


def _auto_device() -> Device:
    # the process's first visible GPU, by its physical index (device_of reports physical indices, so a
    # process pinned with CUDA_VISIBLE_DEVICES=1, or a dask-cuda worker, places on the GPU its arrays are on)
    return Device("cuda", physical_index(0)) if gpu_available() else CPU


def device_exists(dev: Any) -> bool:
    """Whether ``dev`` exists on this machine (the CPU always does).

    >>> device_exists("cpu")
    True
    """
    dev = Device.parse(dev)
    return dev.is_cpu or (gpu_available() and local_ordinal(dev.index) < gpu_count())


def why_unavailable(dev: Any) -> str:
    """Why ``dev`` cannot be used here, in words; ``""`` when it can.

    >>> why_unavailable("cpu")
    ''
    """
    dev = Device.parse(dev)
    if device_exists(dev):
        return ""
    if not gpu_available():
        return f"no GPU is available here: {_probe()[2] or 'gpu_available() is False'}"
    count = gpu_count()
    return (f"this machine has {count} GPU(s) (cuda:0 to cuda:{count - 1})"
            if count else "this machine has no GPU")


# ----------------------------------------------------------------- placement

_PLACEMENT: contextvars.ContextVar[Device | str | None] = contextvars.ContextVar(
    "gpunets_placement", default=None)


class device:
    """Context manager: the default placement of nodes and machines built inside it.

    Blocks nest; the innermost wins.  ``device("auto")`` defers to the configured
    default.  The setting lives in a :mod:`contextvars` variable, so it applies
    to this thread and to tasks that copy the caller's context.

    Parameters
    ----------
    spec : str or Device
        ``"cpu"``, ``"cuda"``, ``"cuda:N"``, a :class:`Device`, or ``"auto"``.

    Examples
    --------
    >>> with device("cuda:1"):
    ...     with device("cpu"):
    ...         inner = current_placement()
    ...     outer = current_placement()
    >>> inner, outer, current_placement()
    (Device('cpu'), Device('cuda:1'), None)
    """

    def __init__(self, spec: str | Device) -> None:
        if spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto"):
            self._spec: Device | str = "auto"
        else:
            self._spec = Device.parse(spec)
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> Device | str:
        self._tokens.append(_PLACEMENT.set(self._spec))
        return self._spec

    def __exit__(self, *exc: object) -> None:
        _PLACEMENT.reset(self._tokens.pop())


def current_placement() -> Device | str | None:
    """What the innermost :class:`device` block set (a Device or ``"auto"``), or None outside.

    >>> current_placement() is None
    True
    """
    return _PLACEMENT.get()


_OVERRIDE: contextvars.ContextVar[Device | None] = contextvars.ContextVar(
    "gpunets_placement_override", default=None)


class override_placement:
    """Context manager: run everything inside on one device, whatever its own placement.

    Used by ``gn.fit(..., device=...)`` and the cross-device test helpers; it
    wins over explicit placements, :class:`device` blocks and the config.
    ``"auto"`` (or None) sets no override.

    Examples
    --------
    >>> with override_placement("cpu"):
    ...     resolve("cuda:1"), placement_override()
    (Device('cpu'), Device('cpu'))
    >>> placement_override() is None
    True
    """

    def __init__(self, spec: str | Device | None) -> None:
        auto = spec is None or (isinstance(spec, str) and spec.strip().lower() == "auto")
        self._spec = None if auto else Device.parse(spec)
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> Device | None:
        self._tokens.append(_OVERRIDE.set(self._spec))
        return self._spec

    def __exit__(self, *exc: object) -> None:
        _OVERRIDE.reset(self._tokens.pop())


def placement_override() -> Device | None:
    """The device forced by the innermost :class:`override_placement` block, or None."""
    return _OVERRIDE.get()


def resolve(spec: str | Device | None = None) -> Device:
    """The device to use for ``spec``: explicit, else the ``device`` block, else the config.

    An :class:`override_placement` block in force wins over all three.

    Parameters
    ----------
    spec : str, Device or None
        An explicit placement; ``None`` or ``"auto"`` means "no preference".

    Returns
    -------
    Device

    Examples
    --------
    >>> resolve("cuda:1")
    Device('cuda:1')
    >>> from gpunets.base.config import config
    >>> with config(device="cpu"):
    ...     resolve("auto")
    Device('cpu')
    """
    forced = _OVERRIDE.get()
    if forced is not None:
        return forced
    for level in (spec, current_placement(), get_config().get("device")):
        if level is None or (isinstance(level, str) and level.strip().lower() == "auto"):
            continue
        return Device.parse(level)
    return _auto_device()


def check_available(dev: str | Device, *, what: str, fallback: str | None = None,
                    owner: Any = None) -> Device:
    """Return the device to use for ``what``: ``dev`` if it exists here, else the CPU or an error.

    Parameters
    ----------
    dev : str or Device
        Where ``what`` is placed.
    what : str
        The culprit, for messages, e.g. ``"machine Ridge"`` or ``"node mean"``.
    fallback : {"warn", "raise", "silent"}, optional
        Default: ``get_config()["fallback"]``.  ``"warn"`` emits one
        :class:`DeviceFallbackWarning` and returns the CPU; ``"silent"`` returns
        the CPU; ``"raise"`` raises :class:`~gpunets.base.exceptions.DeviceUnavailableError`.
    owner : object, optional
        The machine or node placed there: then the warning is given once per (owner, device, reason),
        not at every fit.  Inside a composite's fit the composite is named and is the owner.

    The warning points at the user's line (the first frame outside gpunets).

    Examples
    --------
    >>> check_available("cpu", what="node mean")
    Device('cpu')
    """
    dev = Device.parse(dev)
    if device_exists(dev):
        return dev
    policy = fallback or get_config()["fallback"]
    if policy not in ("warn", "raise", "silent", "cpu"):
        raise ValueError(f"fallback={policy!r} is not a fallback policy; use 'warn', 'raise', 'silent' or 'cpu'.")
    why = why_unavailable(dev)
    if policy == "raise":
        msg = (f"{what} is placed on {dev!s}, but {why}. Place it on 'cpu', or run where a GPU is "
               f"present; gn.config(fallback='warn') runs it on the CPU with a warning.")
        raise DeviceUnavailableError(msg)
    if policy in ("warn", "cpu"):   # "cpu" warns as "warn" does (and refits out-of-memory GPU fits on the CPU)
        composite = fallback_owner()
        if composite is not None:   # inside a composite's own network: name the user's estimator
            inner = re.sub(r"\[fold \d+\]", "", what) if what.startswith("machine ") else "an operation"
            what = f"{type(composite).__name__} ({inner} in its network)"
            owner = composite   # once per (machine, reason) per network: this composite, as long as it lives
        msg = (f"{what} is placed on {dev!s}, but {why}; running it on the CPU instead. "
               f"Place it on 'cpu' to silence this, or use gn.config(fallback='raise') to make it an error.")
        if owner is None:
            warn_user(msg, DeviceFallbackWarning)
        else:
            warn_once((what, str(dev), why), msg, DeviceFallbackWarning, owner=owner)
    return CPU


def local_ordinal(index: int) -> int:
    """The CUDA ordinal of physical GPU ``index`` in this process.

    Where ``CUDA_VISIBLE_DEVICES`` lists GPUs (a dask-cuda worker sees e.g.
    ``"1,0"``), ``cuda:1`` is ordinal 0 of that process; elsewhere the index itself.

    >>> import os
    >>> old = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    >>> local_ordinal(1)
    1
    >>> os.environ["CUDA_VISIBLE_DEVICES"] = "1,0"
    >>> local_ordinal(1), local_ordinal(0)
    (0, 1)
    >>> _ = os.environ.pop("CUDA_VISIBLE_DEVICES") if old is None else os.environ.update(CUDA_VISIBLE_DEVICES=old)
    """
    ids = _visible_ids()
    return ids.index(str(index)) if str(index) in ids else index


def physical_index(ordinal: int) -> int:
    """The physical GPU index of CUDA ordinal ``ordinal`` in this process: the inverse of :func:`local_ordinal`.

    CuPy reports an array's device as the process's ordinal (``x.device.id``);
    :class:`Device` indices are physical, so ``device_of`` maps back through
    ``CUDA_VISIBLE_DEVICES`` (entries that are not integers, e.g. UUIDs, map to themselves).

    >>> import os
    >>> old = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    >>> physical_index(1)
    1
    >>> os.environ["CUDA_VISIBLE_DEVICES"] = "1,0"
    >>> physical_index(0), physical_index(1), local_ordinal(physical_index(0))
    (1, 0, 0)
    >>> _ = os.environ.pop("CUDA_VISIBLE_DEVICES") if old is None else os.environ.update(CUDA_VISIBLE_DEVICES=old)
    """
    ids = _visible_ids()
    if 0 <= ordinal < len(ids) and ids[ordinal].isdigit():
        return int(ids[ordinal])
    return ordinal


def same_device(a: Device, b: Device) -> bool:
    """Whether ``a`` and ``b`` are the same device in this process: equal, or two names of one GPU.

    ``cuda:0`` in a process pinned with ``CUDA_VISIBLE_DEVICES=1`` is process
    ordinal 0, the GPU that ``device_of`` reports by its physical index, ``cuda:1``.

    >>> same_device(Device("cuda", 0), Device("cuda", 1)), same_device(CPU, Device("cpu"))
    (False, True)
    """
    if a == b:
        return True
    if not (a.is_cuda and b.is_cuda):
        return False
    assert a.index is not None and b.index is not None   # a CUDA device always has an index
    return local_ordinal(a.index) == local_ordinal(b.index)


def _visible_ids() -> list[str]:
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [x.strip() for x in visible.split(",")] if visible else []


def host_only(fn: Any) -> Any:
    """Mark operation ``fn`` as host-only: its nodes always run on the CPU, their inputs moved there first.

    For functions that call NumPy (``np.asarray``, ``np.hstack``...) and so cannot read GPU arrays.
    It wins over every placement, ``override_placement`` included: the inputs move to the host
    as explicit moves of the plan.  Returns ``fn`` (a plain function or a ``functools.partial``).

    >>> import numpy as np
    >>> f = host_only(lambda a: np.asarray(a).sum())
    >>> is_host_only(f), is_host_only(np.sum)
    (True, False)
    """
    try:
        fn.__gn_host_only__ = True
    except (AttributeError, TypeError) as exc:
        msg = f"host_only: cannot mark {fn!r} (a {type(fn).__name__}); wrap it in a def or functools.partial first."
        raise TypeError(msg) from exc
    return fn


def is_host_only(fn: Any) -> bool:
    """Whether operation ``fn`` was marked with :func:`host_only`."""
    return getattr(fn, "__gn_host_only__", False) is True
