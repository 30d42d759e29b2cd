"""How a store entry is written and read: its header (format, gpunets' version, CRC-32 and length), its pickle,
and its large arrays after the pickle, raw and aligned, read back as views of the bytes read
(:class:`gpunets.devices.store.Store` keeps the entries; this module only encodes them)."""

from __future__ import annotations

import hashlib
import io
import pickle
import zlib
from typing import Any

from gpunets.devices import _gpulibs
from gpunets.devices.value_types import fortran_only

__all__ = ["VERSION", "dumps"]

#: An entry's first bytes: its payload is checked by CRC-32 (``zlib.crc32``: every burst of up to 32 damaged bits
#: and all but 1 in 2**32 other damage is caught; the length in the header catches a truncation).
_MAGIC = b"GNSTORE2"
#: An entry whose large arrays follow its pickle, raw (:func:`_pack`); checked as :data:`_MAGIC`'s.
_BUFFERED = b"GNSTOREB"
#: The size from which an array's bytes are written apart from the pickle, and the alignment of their start.
_OUT_OF_BAND = 1 << 16
_ALIGN = 64
#: The first format's (read, never written): a blake2b digest of the payload, 32 bytes; 5 times slower to check.
_MAGIC_BLAKE2B = b"GNSTORE1"
def _gpunets_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpunets")
    except PackageNotFoundError:  # pragma: no cover - a source checkout that is not installed
        return "0+unknown"


#: The version written in every entry's header (tests change it to play another version).
VERSION = _gpunets_version()


class _LayoutPickler(pickle.Pickler):
    """Pickles CuPy arrays with their memory layout.  CuPy's own pickling copies through the host in C order,
    so a Fortran-ordered array (a fitted ``PCA``'s ``components_``, made by a transpose) came back C-ordered,
    and the matrix products of the loaded state rounded differently from the fitted one's: a state loaded from
    the store must answer as the one that was fitted, bit for bit."""

    def __init__(self, f: Any, cp: Any, buffer_callback: Any = None) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=buffer_callback)
        self._ndarray = cp.ndarray

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, self._ndarray) and fortran_only(obj):
            return _fortran_on_device, (obj.get(order="F"),)
        return NotImplemented


def _fortran_on_device(host: Any) -> Any:
    """Unpickle a Fortran-ordered CuPy array (see :class:`_LayoutPickler`): on the current device, as CuPy's."""
    cp = _gpulibs.cupy()
    return cp.asfortranarray(cp.asarray(host))


def dumps(obj: Any) -> bytes:
    """``obj`` pickled; by cloudpickle where it is installed (functions by value: a lambda in a
    ``FunctionTransformer``) when pickle cannot.  Either loads with :func:`pickle.loads`.  Where CuPy is loaded,
    its arrays keep their memory layout (:class:`_LayoutPickler`)."""
    try:
        cp = _gpulibs.loaded_cupy()
        if cp is not None:
            buf = io.BytesIO()
            _LayoutPickler(buf, cp).dump(obj)
            return buf.getvalue()
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        try:
            import cloudpickle  # optional (Dask brings it): functions by value
        except ImportError:
            raise                # the pickling error: not stored, said once
        return bytes(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _write(f: Any, data: bytes) -> None:
    """Write ``data`` to ``f`` (one place, so a test can make the disk full)."""
    f.write(data)


def _encode(payload: bytes, magic: bytes = b"GNSTORE2") -> bytes:
    """An entry: the header (``magic``, the gpunets version, the payload's CRC-32 and length), then the
    payload."""
    version = VERSION.encode()
    return b"".join((magic, len(version).to_bytes(2, "little"), version, zlib.crc32(payload).to_bytes(4, "little"),
                     len(payload).to_bytes(8, "little"), payload))


def _header_size() -> int:
    """The bytes before an entry's payload (:func:`_encode`)."""
    return len(_MAGIC) + 2 + len(VERSION.encode()) + 4 + 8


def _dumps_buffered(obj: Any) -> tuple[bytes, list[memoryview]] | None:
    """``obj`` pickled with its buffers of :data:`_OUT_OF_BAND` bytes or more (NumPy arrays) apart (pickle
    protocol 5; CuPy's arrays with their memory layout, :class:`_LayoutPickler`), or None where it has none
    or it does not pickle so (:func:`dumps` then)."""
    cp = _gpulibs.loaded_cupy()
    bufs: list[memoryview] = []

    def apart(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < _OUT_OF_BAND:
            return True    # in the pickle
        bufs.append(raw)
        return False

    try:
        if cp is None:
            stream = pickle.dumps(obj, protocol=5, buffer_callback=apart)
        else:
            out = io.BytesIO()
            _LayoutPickler(out, cp, apart).dump(obj)
            stream = out.getvalue()
    except Exception:  # noqa: BLE001 - pickled by dumps, which says why if it cannot
        return None
    return (stream, bufs) if bufs else None


def _pack(stream: bytes, bufs: list[memoryview]) -> bytes:
    """The payload of an entry with buffers apart: their count and lengths, the pickle, then each buffer raw,
    starting at a multiple of :data:`_ALIGN` bytes from the entry's start (so a view of it is aligned)."""
    head = b"".join((len(bufs).to_bytes(4, "little"), *(b.nbytes.to_bytes(8, "little") for b in bufs),
                     len(stream).to_bytes(8, "little"), stream))
    parts: list[Any] = [head]
    pos = _header_size() + len(head)
    for b in bufs:
        pad = -pos % _ALIGN
        parts += [bytes(pad), b]
        pos += pad + b.nbytes
    return b"".join(parts)


def _unpack(payload: memoryview, start: int) -> Any:
    """The object of a payload made by :func:`_pack` that starts ``start`` bytes into its entry: its buffers
    are views of the payload (of the entry's bytes as read), not copies."""
    n = int.from_bytes(payload[:4], "little")
    lengths = [int.from_bytes(payload[4 + 8 * j:12 + 8 * j], "little") for j in range(n)]
    i = 4 + 8 * n
    m = int.from_bytes(payload[i:i + 8], "little")
    pos = i + 8 + m
    views = []
    for length in lengths:
        pos += -(start + pos) % _ALIGN
        views.append(payload[pos:pos + length])
        pos += length
    if pos != len(payload):
        msg = "an entry's buffers do not fill its payload"
        raise ValueError(msg)
    return pickle.loads(payload[i + 8:i + 8 + m], buffers=views)


def _decode(data: bytes | bytearray) -> memoryview | None:
    """The payload of an entry of this version whose length and checksum match, as a view of ``data`` (no
    copy), else None.  An entry of the first format (:data:`_MAGIC_BLAKE2B`) is checked by its blake2b digest.

    >>> bytes(_decode(_encode(b"state")))
    b'state'
    >>> damaged = bytearray(_encode(b"state")); damaged[-1] ^= 1
    >>> _decode(bytes(damaged)) is None, _decode(_encode(b"state")[:-1]) is None
    (True, True)
    """
    crc = data.startswith(_MAGIC) or data.startswith(_BUFFERED)
    if not (crc or data.startswith(_MAGIC_BLAKE2B)) or len(data) < len(_MAGIC) + 2:
        return None
    i = len(_MAGIC)
    n = int.from_bytes(data[i:i + 2], "little")
    i += 2
    if data[i:i + n] != VERSION.encode():
        return None
    i += n
    width = 4 if crc else 32
    check, length = data[i:i + width], int.from_bytes(data[i + width:i + width + 8], "little")
    payload = memoryview(data)[i + width + 8:]
    if len(payload) != length:
        return None
    if crc:
        ok = zlib.crc32(payload) == int.from_bytes(check, "little")
    else:
        ok = hashlib.blake2b(payload, digest_size=32).digest() == check
    if not ok:
        payload.release()
        return None
    return payload


def _other_version(data: bytes | bytearray) -> bool:
    if not any(data.startswith(m) for m in (_MAGIC, _BUFFERED, _MAGIC_BLAKE2B)) or len(data) < len(_MAGIC) + 2:
        return False
    i = len(_MAGIC)
    n = int.from_bytes(data[i:i + 2], "little")
    return len(data) >= i + 2 + n and data[i + 2:i + 2 + n] != VERSION.encode()
