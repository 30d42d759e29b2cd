"""Reading the store fast, refusing damage all the same (issue 35, item 10).

* An entry's payload is checked by CRC-32 while it is read, once, as a view of the file's bytes (no copy before
  unpickling); an entry damaged anywhere (a bit of a large array, its header's checksum, a truncation) is
  refused, counted and dropped; an entry of the first format (a blake2b digest) is still read, and refused
  when damaged.
* A store that keeps training outputs (``gn.Store(path, outputs=True)``) also keeps a batched Ridge's
  per-fold sums (``XᵀX``, ``Xᵀy``, the offsets): a widened search reads them instead of centring the rows
  again, bit for bit as a cold search; damaged, they are refused and computed again.
"""

import hashlib
import os
import pickle

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import gpunets as gn
from gpunets.devices import store as store_mod


def _flip(path, at):
    data = bytearray(open(path, "rb").read())
    data[at] ^= 0x04
    with open(path, "wb") as f:
        f.write(bytes(data))


def test_an_entry_is_checked_in_one_pass_as_a_view_of_the_file(tmp_path):
    s = gn.Store(tmp_path)
    s.put(b"k" * 16, np.arange(10.0))
    data = open(s._file(b"k" * 16), "rb").read()
    assert data.startswith(b"GNSTORE2")
    payload = store_mod._decode(data)
    assert isinstance(payload, memoryview) and payload.obj is data   # not a copy of the payload
    np.testing.assert_array_equal(pickle.loads(payload), np.arange(10.0))


def _memory(a):
    """The bytes of the object whose memory ``a`` views (the entry's whole bytes, or the array's own)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return len(getattr(a, "obj", a)) if not isinstance(a, np.ndarray) else a.nbytes


def test_a_large_array_is_read_as_a_view_of_the_entry_bit_for_bit(tmp_path):
    s = gn.Store(tmp_path)
    rng = np.random.default_rng(0)
    big, fortran = rng.normal(size=(40_000, 8)), np.asfortranarray(rng.normal(size=(3_000, 30)))
    s.put(b"b" * 16, (big, {"f": fortran, "small": np.arange(3.0)}))
    assert open(s._file(b"b" * 16), "rb").read(8) == b"GNSTOREB"   # its arrays apart from the pickle
    got = s.get(b"b" * 16)
    for value, want in ((got[0], big), (got[1]["f"], fortran)):
        assert _memory(value) == os.path.getsize(s._file(b"b" * 16))   # a view of the entry's bytes: no copy
        assert value.flags.writeable and value.flags.aligned
        assert value.flags.f_contiguous == want.flags.f_contiguous
        np.testing.assert_array_equal(value, want)
    np.testing.assert_array_equal(got[1]["small"], np.arange(3.0))


@pytest.mark.parametrize("where", ["checksum", "first", "middle", "last", "truncated"])
def test_a_large_array_entry_damaged_anywhere_is_refused(tmp_path, where):
    s = gn.Store(tmp_path)
    value = np.random.default_rng(0).normal(size=(40_000, 8))
    key = b"a" * 16
    s.put(key, (value,))
    path = s._file(key)
    size = os.path.getsize(path)
    header = store_mod._header_size()
    if where == "truncated":
        with open(path, "r+b") as f:
            f.truncate(size - 1)
    else:
        _flip(path, {"checksum": header - 9, "first": header, "middle": (header + size) // 2, "last": size - 1}[where])
    assert s.get(key) is None
    assert s.info().corrupt == 1 and not os.path.exists(path)
    assert s.put(key, (value,))
    np.testing.assert_array_equal(s.get(key)[0], value)   # written again whole: served bit for bit


def _first_format(payload):
    version = store_mod.VERSION.encode()
    return b"".join((b"GNSTORE1", len(version).to_bytes(2, "little"), version,
                     hashlib.blake2b(payload, digest_size=32).digest(), len(payload).to_bytes(8, "little"), payload))


def test_an_entry_of_the_first_format_is_read_and_refused_when_damaged(tmp_path):
    s = gn.Store(tmp_path)
    for key, damaged in ((b"1" * 16, False), (b"2" * 16, True)):
        data = bytearray(_first_format(pickle.dumps({"fitted": key})))
        if damaged:
            data[-2] ^= 0x01
        os.makedirs(os.path.dirname(s._file(key)), exist_ok=True)
        with open(s._file(key), "wb") as f:
            f.write(bytes(data))
    assert s.get(b"1" * 16) == {"fitted": b"1" * 16}
    assert s.get(b"2" * 16) is None and s.info().corrupt == 1


def test_the_size_index_is_rewritten_in_place_over_a_longer_count(tmp_path):
    s = gn.Store(tmp_path)
    with open(os.path.join(s.path, ".size"), "w") as f:
        f.write("123456789012345")           # a count written by any writer, longer than the next
    s.clear()                                  # rewrites the index: the folder holds nothing
    assert open(os.path.join(s.path, ".size")).read().strip() == "0"
    s.put(b"k" * 16, [1])
    assert int(open(os.path.join(s.path, ".size")).read()) == s.info().bytes


# --- a batched Ridge's per-fold sums ----------------------------------------------------------------

def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 8))
    return X, X @ rng.normal(size=8) + rng.normal(size=300)


def _search(alphas):
    return gn.GridSearchCV(make_pipeline(StandardScaler(), PCA(4), Ridge()), {"ridge__alpha": alphas}, cv=3)


def _sums(store):
    """The paths of the store's entries that hold a batched Ridge's per-fold sums."""
    out = []
    for _, _, path in store._entries():
        got = pickle.loads(store_mod._decode(open(path, "rb").read()))
        if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], tuple) and got[0][:1] == ("Ridge.fit",):
            out.append(path)
    return out


@pytest.mark.parametrize("damaged", [False, True])
def test_a_widened_search_reads_each_folds_ridge_sums(gn_executor, tmp_path, damaged):
    X, y = _data()
    wide = [0.1, 1.0, 10.0, 100.0]
    cold = _search(wide).fit(X, y)
    plain = gn.Store(tmp_path / "plain")
    with gn.config(store=plain):
        _search(wide[:2]).fit(X, y)
    assert _sums(plain) == []                 # without the opt-in: no sums of training rows kept
    s = gn.Store(tmp_path / "s", outputs=True)
    with gn.config(store=s):
        _search(wide[:2]).fit(X, y)
        sums = _sums(s)
        assert len(sums) == 3                 # one per fold
        for path in sums:
            if damaged:
                _flip(path, os.path.getsize(path) - 20)
            else:
                os.utime(path, (1000, 1000))  # a read touches it
        got = _search(wide).fit(X, y)
    r = got.search_report_
    assert r.fitted == 2 * 3 and r.batched == 2 * 3
    if damaged:   # refused, computed again and kept again whole
        assert sorted(_sums(s)) == sorted(sums)
    else:
        assert all(os.path.getmtime(p) > 1000 for p in sums)
    for k in ("mean_test_score", "split0_test_score", "split1_test_score", "split2_test_score"):
        np.testing.assert_array_equal(got.cv_results_[k], cold.cv_results_[k])
    np.testing.assert_array_equal(got.best_estimator_.predict(X), cold.best_estimator_.predict(X))
