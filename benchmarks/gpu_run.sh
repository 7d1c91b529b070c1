#!/usr/bin/env bash
# Everything ptxbuild checks and measures on a GPU, in one go, logs under $1 (default reports/gpu-logs).
# Assumes `pip install -e '.[test,gpu]'` (or PYTHONPATH=. with the dependencies present) and torch for
# the baselines. Each step has its own time limit so one slow step cannot starve the others; the
# build steps are resumable (the cache keeps every finished verdict and timing).
set -u
mkdir -p "${1:-reports/gpu-logs}"
logs=$(cd "${1:-reports/gpu-logs}" && pwd)
export FLA_FLASH_KDA=0     # time flash-linear-attention's own Triton chunk_kda, not another backend
pb() { python3 -m ptxbuild.cli "$@"; }
step() { local name=$1 limit=$2; shift 2; echo "== $name"; timeout -s INT "$limit" "$@" > "$logs/$name.log" 2>&1; echo "   rc=$? ($logs/$name.log)"; }
step doctor 60 pb doctor
step rmsnorm-selftest 300 python3 ops/rmsnorm/selftest_gpu.py
step planted 300 python3 -m pytest -q -m gpu tests/test_gpu_planted.py -rA -p no:cacheprovider
step rmsnorm-bf16 1800 pb -f benchmarks/rmsnorm_bf16.toml build rmsnorm@h200
step rmsnorm-all 3600 pb build rmsnorm@h200
pb report rmsnorm@h200 > "$logs/rmsnorm-report.txt" 2>&1
(cd examples/model_repo && step model-repo 300 python3 -m pytest -q -m gpu . -rA -p no:cacheprovider)
step kda 900 python3 ops/kda/bench_gpu.py --quick
tail -n 3 "$logs"/*.log
