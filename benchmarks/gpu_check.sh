#!/usr/bin/env bash
# The prepared GPU check, in under 8 minutes on one GPU: the environment and an NVVM probe, a warm-up of the
# kernel caches, the GPU tests twice (without and with CuPy's per-thread default stream) and the GPU benchmark
# sections (gpunets' own host time per GPU task and its fan-in scaling, the executors on a GPU, the combine kernel alone and its host cost per launch, the search on a GPU,
# GPU against CPU end to end with the crossover, graph mode: replay against eager, 8 graphs on 8 streams, a
# predict's latency), each timed part after its own warm-up run; the targets are
# printed as verdicts ("target ...: met" / "NOT met").
# numba-cuda 0.30 cannot run with NumPy 2.5: where the image's NumPy is 2.5 or newer, a NumPy < 2.5 wheel carried in
# GPU_CHECK_WHEELS (default .whl/ at the repository root, git-ignored: carry it to the GPU machine) is installed into
# OUT_DIR/numpy_lt_2_5 and put first on PYTHONPATH for every step.
# Needs CuPy, numba-cuda, scikit-learn and pytest; cuDF, cuML, RMM and Dask are optional (what needs them is
# skipped, and the script says so). NVVM is found for CUDA 12 and 13: system toolkits and NVIDIA's pip wheels
# (benchmarks/gpu_check_tools.py: cuda.pathfinder first, then the toolkit roots for CUDA_HOME).
# Prints one line per section ("[section] ok|skipped|FAILED: ..."), keeps each section's full output in
# OUT_DIR/<section>.log and writes OUT_DIR/gpu_check.json (default benchmarks/results) after every section, so a
# run cut short still leaves what it found; exits non-zero on any failure.
#   bash benchmarks/gpu_check.sh [OUT_DIR]
#   bash benchmarks/gpu_check.sh --fake [OUT_DIR]      # or GPU_CHECK_FAKE=1: the whole script on a CPU, with
#       gpunets' fake GPU (GPUNETS_FAKE_GPU=1) and numba's CUDA simulator, small sizes (default OUT_DIR
#       ${TMPDIR:-/tmp}/gpu_check_fake): proves the script runs; its times are a harness check only.
#   GPU_CHECK_SUITE=1 bash benchmarks/gpu_check.sh     # and, last, the whole suite on the GPU (section 5: about
#       4 more minutes on 16 cores with pytest-xdist; GPU_CHECK_SUITE_TIMEOUT, default 300 s;
#       GPU_CHECK_SUITE_ARGS, default "tests gpunets")
set -uo pipefail
cd "$(dirname "$0")/.."
fake=${GPU_CHECK_FAKE:-0}
if [ "${1:-}" = "--fake" ]; then fake=1; shift; fi
if [ "$fake" = 1 ]; then out=${1:-${TMPDIR:-/tmp}/gpu_check_fake}; else out=${1:-benchmarks/results}; fi
mkdir -p "$out"
py=${PYTHON:-python3}
json="$out/gpu_check.json"
status=0
echo '{}' > "$json"

export PYTHONUNBUFFERED=1 SCIPY_ARRAY_API=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the launch environment of docs/devices.md: per-thread default streams for CuPy and cuDF (before CUDA starts)
export CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 CUDF_PER_THREAD_STREAM=1
if [ "$fake" = 1 ]; then
  export GPU_CHECK_FAKE=1 GPUNETS_FAKE_GPU=1 NUMBA_ENABLE_CUDASIM=1
else
  unset GPU_CHECK_FAKE GPUNETS_FAKE_GPU NUMBA_ENABLE_CUDASIM
fi
echo "gpu_check: $([ "$fake" = 1 ] && echo 'FAKE GPU (harness check only)' || echo 'real GPU'), results in $json"

# NumPy < 2.5 for numba-cuda 0.30 (docs/kernels.md, "NumPy 2.5 and numba-cuda"), from a carried wheel
np_ver=$($py -c 'import numpy; print(numpy.__version__)' 2>/dev/null || echo "")
if [ "$fake" != 1 ] && $py -c 'import sys; v = sys.argv[1].split("."); sys.exit(0 if len(v) > 1 and (int(v[0]), int(v[1])) >= (2, 5) else 1)' "$np_ver" 2>/dev/null; then
  wheels=${GPU_CHECK_WHEELS:-.whl}
  wheel=$(ls "$wheels"/numpy-2.[0-4]*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    target="$(cd "$out" && pwd)/numpy_lt_2_5"
    if $py -m pip install -q --no-index --no-deps --target "$target" "$wheel" > "$out/numpy.log" 2>&1; then
      export PYTHONPATH="$target:$PYTHONPATH"
      echo "gpu_check: NumPy $np_ver cannot run numba-cuda 0.30: using the carried $(basename "$wheel")"
    else
      echo "gpu_check: installing the carried $(basename "$wheel") failed (see $out/numpy.log)"
    fi
  else
    echo "gpu_check: NumPy $np_ver cannot run numba-cuda 0.30 and no numpy<2.5 wheel is carried in $wheels/: the kernel sections will fail"
  fi
fi

save() { $py benchmarks/gpu_check_tools.py save "$json" "$1"; }       # merge stdin's JSON under SECTION
report() { $py benchmarks/gpu_check_tools.py summary "$json" "$1"; }  # the section's one line

# 0. NVVM (numba-cuda compiles through libNVVM): cuda.pathfinder, else a toolkit root exported as CUDA_HOME.
#    Asked without the simulator, which would hide numba-cuda's own library finder.
nvvm_json=$(env -u NUMBA_ENABLE_CUDASIM $py benchmarks/gpu_check_tools.py nvvm 2>/dev/null || echo '{}')
cuda_home=$($py -c 'import json, sys; print(json.loads(sys.argv[1] or "{}").get("export_cuda_home") or "")' \
            "$nvvm_json" 2>/dev/null || true)
[ -n "$cuda_home" ] && export CUDA_HOME="$cuda_home"
export GPU_CHECK_NVVM="$nvvm_json"

# 1. environment and the NVVM probe (one compile_ptx for this GPU's compute capability: needs NVVM, not a GPU)
env -u NUMBA_ENABLE_CUDASIM timeout 90 $py - > "$out/environment.out" 2> "$out/environment.log" <<'PY'
import importlib.metadata as md, importlib.util, json, os, sys
fake = os.environ.get("GPU_CHECK_FAKE") == "1"
nvvm = json.loads(os.environ.get("GPU_CHECK_NVVM") or "{}")
import numpy
info = {"fake_gpu": fake, "simulator": fake, "CUDA_HOME": os.environ.get("CUDA_HOME"), "numpy": numpy.__version__,
        "nvvm": nvvm.get("nvvm"), "nvvm_found_by": nvvm.get("found_by"), "nvvm_search": nvvm,
        "launch_env": {k: os.environ.get(k) for k in ("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "CUDF_PER_THREAD_STREAM",
                                                      "CUDA_DEVICE_MAX_CONNECTIONS")}}
errors = []
cc = (9, 0)
try:
    from gpunets.devices import _gpulibs
    cp = _gpulibs.cupy()
    info["devices"] = cp.cuda.runtime.getDeviceCount()
    if fake:
        info.update(gpu="fake GPU", cupy="fake (gpunets.devices.fakegpu)")
    else:
        info.update(gpu=cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), cupy=cp.__version__)
        cc_text = str(cp.cuda.Device(0).compute_capability)   # "90" -> (9, 0), "100" -> (10, 0)
        cc = (int(cc_text[:-1]), int(cc_text[-1]))
except Exception as e:  # noqa: BLE001
    info["cupy_error"] = repr(e); errors.append("CuPy unusable (see cupy_error)")
info["cc"] = f"{cc[0]}{cc[1]}"
for dist in ("numba", "numba-cuda", "scikit-learn", "cuda-pathfinder"):
    try:
        info[dist.replace("-", "_")] = md.version(dist)
    except md.PackageNotFoundError:
        info[dist.replace("-", "_")] = None
stack = None
if not fake:   # numba-cuda that cannot run with this NumPy (0.30 on NumPy 2.5) is no missing libNVVM: said apart
    try:
        from gpunets.kernels import _cuda
        stack = _cuda.numba_cuda_problem()
    except Exception as e:  # noqa: BLE001
        stack = f"importing gpunets.kernels._cuda failed: {e!r}"
    if stack:
        info["numba_cuda_problem"] = stack
        errors.append(f"numba-cuda cannot compile kernels here: {stack}")
try:
    from numba import cuda
    def probe(a):
        a[0] = 1.0
    cuda.compile_ptx(probe, "(float32[:],)", cc=cc)
    info["nvvm_probe"] = f"ok: compile_ptx for sm_{info['cc']}"
except Exception as e:  # noqa: BLE001
    info["nvvm_probe"] = f"FAILED: {str(e).strip().splitlines()[0][:300] if str(e).strip() else repr(e)}"
    if fake:   # the fake run needs no NVVM (the simulator runs the kernels); say so, do not fail
        info["nvvm_probe"] = "not found (fake mode: not needed)"
    elif not stack:
        errors.append("NVVM unusable: numba-cuda cannot compile kernels (see nvvm_probe, nvvm_search)")
info["absent"] = [m for m in ("cudf", "cuml", "rmm", "dask", "distributed") if importlib.util.find_spec(m) is None]
if errors:
    info["error"] = "; ".join(errors)
print(json.dumps(info))
print(json.dumps(info, indent=2), file=sys.stderr)
sys.exit(1 if errors else 0)
PY
[ $? -eq 0 ] || status=1
save environment < "$out/environment.out"
report environment
cc=$($py -c 'import json, sys; print(json.load(open(sys.argv[1])).get("environment", {}).get("cc") or "90")' "$json")

# 2. warm the caches before anything is timed: every combine kernel compiled to PTX for this GPU (NVVM and
#    numba-cuda's typing of every kernel, dtype and K), then one small run of each benchmark's GPU work in a
#    process of its own, which fills CuPy's on-disk kernel cache (~/.cupy/kernel_cache) for the timed sections.
#    Each section still does its own untimed warm-up run (numba-cuda compiles per process).
GPU_CHECK_CC=$cc timeout 240 $py - > "$out/warm.out" 2> "$out/warm.log" <<'PY'
import contextlib, json, os, subprocess, sys, time
import numpy as np
fake = os.environ.get("GPU_CHECK_FAKE") == "1"
cc = os.environ.get("GPU_CHECK_CC", "90")
res = {"fake_gpu": fake, "cc": cc}
t0 = time.perf_counter()
args = [sys.executable, "-m", "gpunets.kernels", "--ptx", "--cc", cc] + (["--kernels", "mean", "--k", "8"] if fake else [])
p = subprocess.run(args, capture_output=True, text=True, timeout=180)
print(p.stdout[-4000:], p.stderr[-4000:], file=sys.stderr)
last = (p.stdout.strip().splitlines() or [""])[-1]
if p.returncode == 0:
    res["ptx"] = last.split(" (")[0] + f" for sm_{cc}"   # "255 compiled, 0 failed, in 15.9 s for sm_90"
elif p.returncode == 3 and fake:
    res["ptx"] = "PTX skipped: no NVVM (fake mode: not needed)"
else:
    res["ptx"] = f"FAILED (exit {p.returncode})"
    res["error"] = f"python -m gpunets.kernels --ptx --cc {cc} exited with {p.returncode}: {(p.stderr or last).strip()[-300:]}"
res["ptx_seconds"] = round(time.perf_counter() - t0, 1)
t1 = time.perf_counter()
try:
    from gpunets import kernels
    from gpunets.devices import _gpulibs
    cp = _gpulibs.cupy()
    for dt in (np.float32, np.float64):
        arrays = [cp.asarray(np.full(4096, i, dtype=dt)) for i in range(8)]
        cp.asnumpy(kernels.mean(arrays, target="cuda"))
    if not fake:   # the fake compiles nothing: its benchmark runs would only cost time
        from benchmarks import bench_executors, bench_tuning
        with contextlib.redirect_stdout(sys.stderr):   # stdout is the JSON alone
            bench_executors.gpu_streams(quick=True, png=None)
            bench_tuning.gpu_search(quick=True, rows=2_000)
    cp.cuda.Device().synchronize()
except Exception as e:  # noqa: BLE001
    import traceback
    res["error"] = f"warm-up run failed: {e!r}"
    res["traceback"] = traceback.format_exc()
res["warm_seconds"] = round(time.perf_counter() - t1, 1)
print(json.dumps(res, default=str))
sys.exit(1 if "error" in res else 0)
PY
[ $? -eq 0 ] || status=1
save warm < "$out/warm.out"
report warm

# 3. the GPU tests (-m gpu: the tests CI skips), with CuPy on the legacy default stream and on per-thread ones.
#    Tests needing cuDF, cuML or Dask skip themselves where those are absent; on the fake GPU every one skips.
run_tests() {   # run_tests NAME [env arguments: VAR=VALUE or -u VAR]
  local name=$1; shift
  env "$@" timeout 120 $py -m pytest -q -rs -m gpu -p no:cacheprovider --continue-on-collection-errors \
      --junitxml="$out/$name.xml" tests > "$out/$name.log" 2>&1
  local rc=$?
  $py benchmarks/gpu_check_tools.py junit "$out/$name.xml" "$rc" "$*" > "$out/$name.out"
  save "$name" < "$out/$name.out"
  report "$name"
  return $rc
}
run_tests gpu_tests_legacy_stream -u CUPY_CUDA_PER_THREAD_DEFAULT_STREAM -u CUDF_PER_THREAD_STREAM || status=1
run_tests gpu_tests_per_thread_stream CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1 || status=1

# 4. the GPU benchmark sections, in the launch environment (each skips itself without a GPU: here a skip is a
#    failure); quick sizes on the fake GPU. gpu_vs_cpu: 10^4 to 10^6 rows within a 90 s budget for its warm cells
#    (a cell that would pass it is skipped and says so), then each mode's cold run (gpu_part, 10^4 rows)
for section in host_cost executors_gpu kernels_gpu tuning_gpu tuning_gpu_batch gpu_vs_cpu graphs; do
  limit=90; [ "$section" = gpu_vs_cpu ] && limit=180
  timeout $limit $py - "$out" "$section" > "$out/$section.out" 2> "$out/$section.log" <<'PY'
import contextlib, json, os, sys, time, traceback
out, section = sys.argv[1], sys.argv[2]
fake = os.environ.get("GPU_CHECK_FAKE") == "1"
from benchmarks import bench_executors, bench_gpu_vs_cpu, bench_graphs, bench_kernels, bench_tuning
run = {# gpunets' own host time per GPU task (the fake GPU in process: its GPU work is nil), fan-in 4000 vs 400
       "host_cost": lambda: bench_executors.host_cost(quick=True),
       "executors_gpu": lambda: bench_executors.gpu_streams(quick=fake, png=f"{out}/executors_gpu_timeline.png"),
       # the mean kernel alone (20 launches between events) against a device copy; the host per launch per path
       "kernels_gpu": lambda: bench_kernels.gpu_section(quick=True),
       # the one-stage search on CuPy data, device="cuda": streams vs serial, scores against the CPU (< 40 s)
       "tuning_gpu": lambda: bench_tuning.gpu_search(rows=600 if fake else 50_000, quick=fake),
       # the Ridge alphas of a fold batched on the GPU (one SVD per fold) against one candidate at a time
       "tuning_gpu_batch": lambda: bench_tuning.gpu_batch(rows=600 if fake else 50_000, quick=fake),
       # GPU against CPU end to end: CPU serial, CPU best, GPU auto, GPU streams; the crossover and its plot
       "gpu_vs_cpu": lambda: bench_gpu_vs_cpu.run(
           quick=True, budget=20 if fake else 90, png=f"{out}/gpu_vs_cpu.png", cold_workloads=("gpu_part",),
           **(dict(rows=(150,), workloads=("gpu_part", "search"), dtypes=("float64",), repeat=1) if fake else {})),
       # graph mode: the mid-size workload replayed vs eager serial, 8 graphs on 8 streams vs one, a predict's latency
       "graphs": lambda: bench_graphs.graphs_section(quick=fake)}[section]
t0 = time.perf_counter()
try:
    with contextlib.redirect_stdout(sys.stderr):   # progress lines go to the log; stdout is the JSON alone
        res = run()
except Exception as e:  # noqa: BLE001 - reported, and the script fails
    res = {"error": repr(e), "traceback": traceback.format_exc()}
res["wall_seconds"] = round(time.perf_counter() - t0, 2)
if "skipped" in res:
    res["error"] = f"skipped: {res['skipped']}"
print(json.dumps(res, default=str))
print(section, json.dumps(res, indent=2, default=str), file=sys.stderr)
sys.exit(1 if "error" in res else 0)
PY
  [ $? -eq 0 ] || status=1
  save "$section" < "$out/$section.out"
  report "$section"
done

# 5. opt-in (GPU_CHECK_SUITE=1): the whole suite on the GPU, as CI runs it on the CPU and the fake GPU: the
#    gn_device tests include "cuda" and device="auto" is the GPU. Over xdist (-n 14) where pytest-xdist is
#    installed; about 3 to 4 minutes on an H200 machine of 16 cores. The tests that need Dask, cuDF or cuML skip
#    themselves where those are absent.
if [ "${GPU_CHECK_SUITE:-0}" = 1 ]; then
  xdist=$($py -c 'import xdist' 2>/dev/null && echo "-n ${GPU_CHECK_SUITE_WORKERS:-14}" || echo "")
  timeout "${GPU_CHECK_SUITE_TIMEOUT:-300}" $py -m pytest -q $xdist -rfE -p no:cacheprovider \
      --junitxml="$out/whole_suite.xml" ${GPU_CHECK_SUITE_ARGS:-tests gpunets} > "$out/whole_suite.log" 2>&1
  rc=$?
  $py benchmarks/gpu_check_tools.py junit "$out/whole_suite.xml" "$rc" "whole suite${xdist:+, xdist $xdist}" --suite \
    | save whole_suite
  [ $rc -eq 0 ] || status=1
  report whole_suite
fi

# 6. several GPUs (only with 2 or more): dask-cuda's LocalCUDACluster, one worker per GPU; each cuda:N
#    placement runs on the worker owning GPU N, fitted states stay there (tests/test_dask.py -k cuda_cluster)
n_gpus=$($py -c 'from gpunets import _gpulibs; print(_gpulibs.cupy().cuda.runtime.getDeviceCount())' 2>/dev/null || echo 0)
if [ "${n_gpus:-0}" -ge 2 ] && [ "$fake" != 1 ]; then
  timeout 150 $py -m pytest -q -rs -p no:cacheprovider tests/test_dask.py -k cuda_cluster \
      --junitxml="$out/multi_gpu.xml" > "$out/multi_gpu_dask.log" 2>&1
  rc=$?
  echo "{\"gpus\": $n_gpus, \"pytest_exit_code\": $rc$([ $rc -ne 0 ] && echo ', "error": "multi-GPU dask tests failed (5: none collected, 124: timeout)"')}" \
    | save multi_gpu_dask
  [ $rc -eq 0 ] || status=1
else
  echo "{\"skipped\": \"${n_gpus:-0} GPU(s): the multi-GPU section needs 2 or more real ones\"}" | save multi_gpu_dask
fi
report multi_gpu_dask

$py benchmarks/gpu_check_tools.py failed "$json" || status=1
echo "gpu_check: $([ $status -eq 0 ] && echo PASSED || echo FAILED)$([ "$fake" = 1 ] && echo ' (fake GPU: harness check only)') (results in $json, logs in $out/*.log)"
exit $status
