"""Shared test set-up.

* Without a real GPU, numba's CUDA simulator is switched on before anything
  imports numba, so the CUDA kernels run (slowly, on small grids) on the CPU.
* ``gpunets.testing`` provides the ``gn_executor`` / ``gn_device`` fixtures and
  skips ``@pytest.mark.gpu`` tests where no GPU is present.
"""

import os
import shutil

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not (shutil.which("nvidia-smi") or os.path.exists("/dev/nvidia0")):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import pytest  # noqa: E402

pytest_plugins = ["gpunets.testing", "pytester"]


@pytest.fixture
def no_gpu():
    """No GPU here: the fake GPU off, and a real GPU hidden from gpunets (``gpunets.testing.no_gpu``)."""
    from gpunets.testing import no_gpu as hidden

    with hidden():
        yield


@pytest.fixture
def executor(gn_executor):
    """Alias: each test that takes ``executor`` runs once per executor present."""
    return gn_executor


# --- host-only tests: the few whose behaviour cannot exist on a GPU (docs/testing.md lists every one) -------------

def pytest_configure(config):
    config.addinivalue_line(
        "markers", "host_only(reason): a behaviour that exists only on the host; skipped in the fake-GPU lane, "
                   "with its reason (docs/testing.md lists every such test)")


def host_only_reason(item):
    """The reason of ``item``'s ``host_only`` marker; None without one. A bare marker is a usage error."""
    mark = item.get_closest_marker("host_only")
    if mark is None:
        return None
    reason = mark.args[0] if mark.args else mark.kwargs.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        msg = (f"{item.nodeid}: @pytest.mark.host_only needs a reason, e.g. "
               f"@pytest.mark.host_only('sparse input: no GPU array holds it'); got {mark.args or mark.kwargs}.")
        raise pytest.UsageError(msg)
    return reason


def pytest_collection_modifyitems(config, items):
    from gpunets.devices._gpulibs import fake_gpu_count

    lane = bool(fake_gpu_count())
    for item in items:
        reason = host_only_reason(item)
        if reason is not None and lane:
            item.add_marker(pytest.mark.skip(reason=f"host-only: {reason}"))
