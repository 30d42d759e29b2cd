"""Tests of gpunets.devices.placement: the Device value, detection, placement blocks, availability checks."""

import contextvars
import subprocess
import os
import sys
import warnings

import pytest

import gpunets.devices.placement as gd
from gpunets.base.config import config
from gpunets.devices.placement import (CPU, Device, DeviceFallbackWarning, check_available, current_placement,
                             device, override_placement, placement_override, resolve)
from gpunets.base.exceptions import DeviceUnavailableError


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(gd, "gpu_available", lambda: False)
    monkeypatch.setattr(gd, "gpu_count", lambda: 0)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(gd, "gpu_available", lambda: True)
    monkeypatch.setattr(gd, "gpu_count", lambda: 2)


# ----------------------------------------------------------------- Device


@pytest.mark.parametrize("spec, expected", [
    ("cpu", Device("cpu")), ("CPU", Device("cpu")), ("cuda", Device("cuda", 0)),
    ("cuda:0", Device("cuda", 0)), ("cuda:3", Device("cuda", 3)), (" cuda:1 ", Device("cuda", 1)),
    (Device("cuda", 2), Device("cuda", 2)),
])
def test_parse_valid_forms(spec, expected):
    assert Device.parse(spec) == expected


def test_cuda_means_cuda_0():
    assert Device.parse("cuda") == Device.parse("cuda:0") == Device("cuda") == Device("cuda:0")
    assert str(Device("cuda")) == "cuda:0"
    assert Device("cuda").index == 0 and Device("cpu").index is None


@pytest.mark.parametrize("spec", ["cuda:x", "tpu", "cuda:-1", 3, "gpu", "", None, 1.5, "cuda:1:2", True])
def test_parse_invalid_lists_valid_forms(spec):
    with pytest.raises(ValueError) as info:
        Device.parse(spec)
    msg = str(info.value)
    assert repr(spec) in msg
    assert "'cpu', 'cuda', 'cuda:N' (N >= 0), or 'auto'" in msg


def test_parse_int_hint_and_gpu_hint():
    with pytest.raises(ValueError, match=r"write 'cuda:3'"):
        Device.parse(3)
    with pytest.raises(ValueError, match=r"GPUs are written 'cuda' or 'cuda:N'"):
        Device.parse("gpu")


def test_invalid_constructor_arguments():
    with pytest.raises(ValueError, match="takes no index"):
        Device("cpu", 0)
    with pytest.raises(ValueError, match="index"):
        Device("cuda", -1)
    with pytest.raises(ValueError, match="Invalid device kind 'tpu'"):
        Device("tpu")


def test_equality_hash_str_repr():
    assert hash(Device("cuda", 1)) == hash(Device.parse("cuda:1"))
    assert len({Device("cpu"), CPU, Device.parse("cpu")}) == 1
    assert Device("cuda", 1) != Device("cuda", 0) != CPU
    assert str(Device("cuda", 1)) == "cuda:1" and str(CPU) == "cpu"
    assert repr(Device("cuda", 1)) == "Device('cuda:1')" and repr(CPU) == "Device('cpu')"
    assert Device("cuda", 1).is_cuda and not Device("cuda", 1).is_cpu
    assert CPU.is_cpu and not CPU.is_cuda


def test_frozen():
    with pytest.raises(AttributeError):
        Device("cpu").kind = "cuda"


def test_parsing_is_cached():
    gd._parse_str.cache_clear()
    a = Device.parse("cuda:5")
    b = Device.parse("cuda:5")
    assert a is b
    assert gd._parse_str.cache_info().hits >= 1


def test_parse_auto(monkeypatch):
    monkeypatch.setattr(gd, "gpu_available", lambda: True)
    assert Device.parse("auto") == Device("cuda", 0)
    monkeypatch.setattr(gd, "gpu_available", lambda: False)
    assert Device.parse("auto") == CPU


# ----------------------------------------------------------------- detection


def test_gpu_detection_is_honest_here():
    # cupy is not installed in this environment: detection must say so, without raising
    assert isinstance(gd.gpu_available(), bool)
    assert gd.gpu_count() >= 0
    if "cupy" not in sys.modules and not os.environ.get("GPUNETS_FAKE_GPU"):
        try:
            import cupy  # noqa: F401
        except ImportError:
            assert gd.gpu_available() is False and gd.gpu_count() == 0
            assert "CuPy is not importable" in gd.why_unavailable("cuda")


def test_importing_does_not_import_gpu_libraries():
    code = ("import sys, gpunets.devices.placement, gpunets.devices.data, gpunets.compute.models; "
            "print([m for m in ('cupy', 'cudf', 'cuml', 'numba', 'dask') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------- placement


def test_device_blocks_nest():
    assert current_placement() is None
    with device("cuda:1") as d1:
        assert d1 == Device("cuda", 1) == current_placement()
        with device("cpu"):
            assert current_placement() == CPU
            with device("auto"):
                assert current_placement() == "auto"
            assert current_placement() == CPU
        assert current_placement() == Device("cuda", 1)
    assert current_placement() is None


def test_device_block_validates_spec_eagerly():
    with pytest.raises(ValueError, match="'cuda:N'"):
        device("cuda:x")


def test_device_block_is_reusable_and_reentrant():
    block = device("cpu")
    with block:
        with block:
            assert current_placement() == CPU
        assert current_placement() == CPU
    assert current_placement() is None


def test_device_block_is_context_local():
    with device("cuda:1"):
        ctx = contextvars.copy_context()
    assert ctx.run(current_placement) == Device("cuda", 1)
    assert contextvars.Context().run(current_placement) is None


def test_resolve_order(no_gpu):
    assert resolve("cuda:1") == Device("cuda", 1)  # explicit wins, even without a GPU
    assert resolve(None) == CPU
    with config(device="cuda:2"):
        assert resolve(None) == Device("cuda", 2)
        assert resolve("auto") == Device("cuda", 2)
        with device("cpu"):
            assert resolve(None) == CPU
            assert resolve("cuda") == Device("cuda", 0)
            with device("auto"):  # "auto" defers to the config default
                assert resolve(None) == Device("cuda", 2)


def test_override_placement_wins(no_gpu):
    assert placement_override() is None
    with config(device="cuda:2"), device("cuda:1"):
        with override_placement("cpu") as forced:
            assert forced == CPU == placement_override()
            assert resolve("cuda:3") == CPU and resolve(None) == CPU
            with override_placement("auto"):  # no override inside
                assert placement_override() is None and resolve(None) == Device("cuda", 1)
        assert resolve(None) == Device("cuda", 1)
    assert placement_override() is None
    with pytest.raises(ValueError, match="'cuda:N'"):
        override_placement("tpu")


@pytest.mark.parametrize("available, expected", [(True, Device("cuda", 0)), (False, CPU)])
def test_resolve_auto_default(monkeypatch, available, expected):
    monkeypatch.setattr(gd, "gpu_available", lambda: available)
    assert resolve("auto") == expected
    assert resolve(None) == expected
    with device("auto"):
        assert resolve(None) == expected


# ----------------------------------------------------------------- check_available


def test_check_available_existing_devices(two_gpus):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_available("cpu", what="node mean") == CPU
        assert check_available("cuda:1", what="node mean", fallback="raise") == Device("cuda", 1)


def test_check_available_raise_without_gpu(no_gpu):
    with pytest.raises(DeviceUnavailableError) as info:
        check_available("cuda", what="machine Ridge", fallback="raise")
    msg = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert msg.startswith("machine Ridge is placed on cuda:0, but no GPU is available here")
    assert "Place it on 'cpu', or run where a GPU is present" in msg
    assert "gn.config(fallback='warn') runs it on the CPU with a warning" in msg


def test_check_available_raise_index_too_high(two_gpus):
    with pytest.raises(DeviceUnavailableError, match=r"has 2 GPU\(s\) \(cuda:0 to cuda:1\)"):
        check_available("cuda:2", what="node mean", fallback="raise")


def test_check_available_warn_once(no_gpu):
    with pytest.warns(DeviceFallbackWarning) as record:
        assert check_available("cuda:0", what="node mean", fallback="warn") == CPU
    assert len(record) == 1
    msg = str(record[0].message)
    assert "node mean is placed on cuda:0" in msg and "running it on the CPU instead" in msg
    assert "no GPU is available here" in msg
    assert issubclass(DeviceFallbackWarning, UserWarning)


def test_check_available_silent(no_gpu):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_available("cuda:0", what="node mean", fallback="silent") == CPU


def test_check_available_default_from_config(no_gpu):
    with config(fallback="raise"):
        with pytest.raises(DeviceUnavailableError):
            check_available("cuda", what="node mean")
    with config(fallback="silent"):
        assert check_available("cuda", what="node mean") == CPU


def test_check_available_bad_policy(no_gpu):
    with pytest.raises(ValueError, match="not a fallback policy"):
        check_available("cuda", what="node mean", fallback="loud")


def test_config_validates_device_through_parse():
    with pytest.raises(ValueError, match="'cuda:N'"):
        with config(device="tpu"):
            pass


# ----------------------------------------------------------------- CUDA_VISIBLE_DEVICES


@pytest.mark.parametrize("visible, physical, ordinal", [
    (None, 1, 1), ("1,0", 1, 0), ("1,0", 0, 1), ("2,3", 3, 1), ("3,1,0,2", 2, 3),
])
def test_physical_index_inverts_local_ordinal(monkeypatch, visible, physical, ordinal):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert gd.local_ordinal(physical) == ordinal
    assert gd.physical_index(ordinal) == physical


def test_physical_index_keeps_uuid_entries(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2c,GPU-11aa")
    assert gd.physical_index(1) == 1 and gd.local_ordinal(1) == 1


def test_device_exists_for_a_listed_physical_gpu(monkeypatch, two_gpus):
    # a dask-cuda worker of LocalCUDACluster(CUDA_VISIBLE_DEVICES="2,3") sees two GPUs: physical 2 and 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2")
    assert gd.device_exists("cuda:2") and gd.device_exists("cuda:3")
    assert check_available("cuda:3", what="node n", fallback="raise") == Device("cuda", 3)


def test_auto_device_is_the_first_visible_gpu_by_physical_index(monkeypatch):
    import gpunets.devices.placement as devices

    monkeypatch.setattr(devices, "gpu_available", lambda: True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert devices._auto_device() == devices.Device("cuda", 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")     # a dask-cuda worker for GPU 2, or a pinned process
    assert devices._auto_device() == devices.Device("cuda", 2)
    # cuda:0 there is process ordinal 0, the same GPU that device_of reports as cuda:2: no copy between them
    assert devices.same_device(devices.Device("cuda", 0), devices.Device("cuda", 2))
    assert not devices.same_device(devices.Device("cuda", 3), devices.Device("cuda", 2))
    assert not devices.same_device(devices.CPU, devices.Device("cuda", 2))
