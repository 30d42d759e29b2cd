#!/usr/bin/env bash
# The prepared GPU check: the GPU tests and the GPU benchmark sections, in under 5 minutes.
# Needs CuPy, numba-cuda, scikit-learn and pytest; cuDF and cuML are optional (what needs them is skipped,
# and the script says so). Writes $OUT_DIR/gpu_check.json (default benchmarks/results: the GPU, what is
# installed, the tests' outcome and the benchmark figures) and exits non-zero on any failure.
#   bash benchmarks/gpu_check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SCIPY_ARRAY_API=1 CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1
unset NUMBA_ENABLE_CUDASIM
py=${PYTHON:-python3}
status=0
$py - "$out" <<'PY' || status=1
import importlib.util, json, sys
import cupy
info = {"gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "devices": cupy.cuda.runtime.getDeviceCount(), "cupy": cupy.__version__}
try:
    import numba, numba.cuda
    info["numba"] = numba.__version__
    info["numba_cuda"] = getattr(numba.cuda, "implementation", "?")
    info["numba_cuda_available"] = bool(numba.cuda.is_available())
except Exception as e:  # reported; the GPU tests below fail on it too
    info["numba_error"] = repr(e)
print("GPU:", info["gpu"], "| devices:", info["devices"], "| CuPy", info["cupy"], "| numba", info.get("numba"))
for m in ("cudf", "cuml", "dask_cuda"):
    have = importlib.util.find_spec(m) is not None
    info[m] = "installed" if have else "NOT installed: the tests that need it are skipped"
    print(f"{m}: {info[m]}")
json.dump(info, open(f"{sys.argv[1]}/gpu_check_env.json", "w"), indent=2)
PY
# The GPU tests: -m gpu selects them; they are the same tests CI skips. -rs lists what was skipped, and why.
timeout 170 $py -m pytest -q -rs -m gpu -p no:cacheprovider --junitxml="$out/gpu_tests.xml" tests
tests_rc=$?
[ $tests_rc -eq 0 ] || status=1
# The GPU benchmark sections (each skips itself without a GPU), and the JSON of everything.
timeout 120 $py - "$out" "$tests_rc" <<'PY' || status=1
import json, os, sys, time, traceback
import xml.etree.ElementTree as ET
sys.path.insert(0, ".")
out, tests_rc = sys.argv[1], int(sys.argv[2])
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S")}
try:
    res["environment"] = json.load(open(f"{out}/gpu_check_env.json"))
except (OSError, ValueError) as e:
    res["environment"] = {"error": repr(e)}
tests = {"pytest_exit_code": tests_rc, "passed": tests_rc == 0}
try:
    root = ET.parse(f"{out}/gpu_tests.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    for k in ("tests", "failures", "errors", "skipped"):
        tests[k] = int(suite.get(k, 0))
    tests["skipped_because"] = sorted({(s.get("message") or "")[:200] for s in root.iter("skipped")})
    tests["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
                       if c.find("failure") is not None or c.find("error") is not None]
except (OSError, ET.ParseError, AttributeError) as e:
    tests["junit_error"] = repr(e)
if tests_rc != 0:
    tests["error"] = f"pytest exited with {tests_rc} (124: the 170 s timeout; 5: no GPU test collected)"
elif tests.get("tests", 0) and tests.get("skipped") == tests.get("tests"):
    tests["error"] = "every GPU test was skipped: no usable GPU seen (see skipped_because)"
res["tests"] = tests
from benchmarks import bench_executors, bench_kernels
for key, run in (("executors_gpu", lambda: bench_executors.gpu_streams(quick=False,
                                                                        png=f"{out}/executors_gpu_timeline.png")),
                 ("kernels_gpu", lambda: bench_kernels.gpu_section(quick=True))):
    t0 = time.perf_counter()
    try:
        res[key] = run()
    except Exception as e:  # reported, and the script fails
        res[key] = {"error": repr(e), "traceback": traceback.format_exc()}
    res[key]["wall_seconds"] = round(time.perf_counter() - t0, 2)
    if "skipped" in res[key]:  # on the machine this script is for, a skipped GPU section is a failure
        res[key]["error"] = f"skipped: {res[key]['skipped']}"
json.dump(res, open(f"{out}/gpu_check.json", "w"), indent=2, default=str)
print(json.dumps({k: v for k, v in res.items() if k != "environment"}, indent=2, default=str))
bad = [k for k, v in res.items() if isinstance(v, dict) and "error" in v]
if bad:
    print("failed:", ", ".join(bad))
sys.exit(1 if bad else 0)
PY
echo "gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED) (results in $out/gpu_check.json)"
exit $status
