"""The store's size bound (issue 35 items 8-9): ``max_bytes`` holds whoever writes the folder, and any integral
number is a number of bytes."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from sklearn.linear_model import Ridge

import gpunets as gn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _on_disk(path):
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, fs in os.walk(path) for n in fs if n.endswith(".gnst"))


def test_max_bytes_holds_when_two_stores_write_one_folder_in_turn(tmp_path):
    a, b = gn.Store(tmp_path, max_bytes=5000), gn.Store(tmp_path, max_bytes=5000)
    blob = b"x" * 900
    for i in range(20):
        (a if i % 2 else b).put(bytes([i]) * 16, blob)
        assert _on_disk(tmp_path) <= 5000, f"after write {i}: {_on_disk(tmp_path)} bytes on disk"
    assert a.info().bytes <= 5000 and a.info().entries >= 4   # the bound is met by evicting, not by refusing
    assert a.get(bytes([19]) * 16) == blob                     # the newest entries stay


def test_max_bytes_holds_for_fits_by_two_stores_on_one_folder(tmp_path, executor):
    rng = np.random.default_rng(0)
    X, y = gn.source(rng.normal(size=(200, 40)), name="X"), gn.source(rng.normal(size=200), name="y")
    size = None
    stores = [gn.Store(tmp_path / "s", max_bytes=4096), gn.Store(tmp_path / "s", max_bytes=4096)]
    for i in range(12):
        with gn.config(store=stores[i % 2]):
            m = gn.machine(Ridge(alpha=float(i)), X, y)
            assert m.fit(executor=executor).actions[m] == "train"
        size = size or _on_disk(tmp_path / "s")
        assert _on_disk(tmp_path / "s") <= 4096
    assert size is not None and 4096 // size < 12   # the bound was reached: entries were evicted


_WRITER = textwrap.dedent("""
    import sys, gpunets as gn
    s = gn.Store(sys.argv[1], max_bytes=6000)
    who = int(sys.argv[2])
    for line in sys.stdin:   # one write per line the test sends: the processes write in turn
        s.put(bytes([who, int(line)]) * 8, b"y" * 700)
        print("ok", flush=True)
""")


def test_max_bytes_holds_when_processes_write_one_store_in_turn(tmp_path):
    path = str(tmp_path / "shared")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, path, str(k)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env, text=True) for k in range(2)]
    try:
        for i in range(24):   # entries of about 800 bytes: the folder holds at most 7
            p = procs[i % 2]
            p.stdin.write(f"{i}\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "ok"
            assert _on_disk(path) <= 6000, f"after write {i}: {_on_disk(path)} bytes"
    finally:
        for p in procs:
            p.stdin.close()
            assert p.wait(timeout=60) == 0
    assert not [n for _, _, fs in os.walk(path) for n in fs if n.endswith(".partial")]
    assert gn.Store(path).info().entries >= 5


@pytest.mark.parametrize("size", [np.int64(1 << 20), np.int32(1 << 20), np.uint64(1 << 20)])
def test_max_bytes_takes_any_integral_number(tmp_path, size, executor):
    s = gn.Store(tmp_path, max_bytes=size)
    assert s.max_bytes == 1 << 20 and type(s.max_bytes) is int
    assert repr(s).endswith(f"max_bytes={1 << 20})")
    rng = np.random.default_rng(0)
    X, y = gn.source(rng.normal(size=(50, 3)), name="X"), gn.source(rng.normal(size=50), name="y")
    with gn.config(store=s):
        m = gn.machine(Ridge(), X, y)
        m.fit(executor=executor)
        m2 = gn.machine(Ridge(), X, y)
        assert m2.fit(executor=executor).actions[m2] == "stored"


@pytest.mark.parametrize("bad", [-1, np.int64(-5), 0, 1.5, np.float64(1e6), 1e6, "lots", "-3MB", True,
                                 np.bool_(True), [1000], None])
def test_bad_max_bytes_is_refused_clearly(tmp_path, bad):
    with pytest.raises(ValueError, match=r"max_bytes=.*\(\w+\) is not a positive size.*integral number.*Hint"):
        gn.Store(tmp_path / "s", max_bytes=bad)
    assert not (tmp_path / "s").exists()   # refused before anything changed
