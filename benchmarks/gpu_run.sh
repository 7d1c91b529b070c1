#!/usr/bin/env bash
# Everything ptxbuild checks and measures on a GPU, in one go; logs under $1 (default lab/gpu-logs).
# Assumes `pip install -e '.[test,gpu]'` (or PYTHONPATH=. with the dependencies present), torch for
# the baselines and fla-core for the KDA comparison. Each step has its own time limit (SIGINT, so a
# build keeps what it finished and writes its report marked "interrupted"); every build step resumes
# from the cache when the script is run again.
set -u
mkdir -p "${1:-lab/gpu-logs}"
logs=$(cd "${1:-lab/gpu-logs}" && pwd)
export FLA_FLASH_KDA=0     # time flash-linear-attention's own Triton chunk_kda, not another backend
PB="python3 -m ptxbuild.cli"
# `timeout` runs programs, not shell functions: steps are given as commands
step() { local name=$1 limit=$2; shift 2; echo "== $name"; timeout -s INT "$limit" "$@" > "$logs/$name.log" 2>&1; echo "   rc=$? ($logs/$name.log)"; }
step doctor 60 $PB doctor
step rmsnorm-selftest 300 python3 benchmarks/rmsnorm_selftest_gpu.py
step planted 300 python3 -m pytest -q -m gpu tests/test_gpu_planted.py -rA -p no:cacheprovider
step rmsnorm-bf16 900 $PB -f benchmarks/rmsnorm_bf16.toml build rmsnorm@h200
step rmsnorm-all 1800 $PB build rmsnorm@h200
step sweep 600 $PB -f lab/rmsnorm_sweep.toml build rmsnorm@h200
step sweep-cross 600 $PB -f lab/rmsnorm_sweep.toml build rmsnorm@h200 --force
$PB record lab/warmstart/rmsnorm-h200.recording.jsonl --op rmsnorm --gpu h200 > "$logs/record.log" 2>&1
(cd examples/model_repo && step model-repo-build 300 $PB build rmsnorm@h200 &&
 step model-repo 300 python3 -m pytest -q -m gpu . -rA -p no:cacheprovider)
# rmsnorm: where torch.compile wins by 1-4% (N = 2K-32K), the L2-policy hypothesis (ops/rmsnorm/NOTES.md, run 12):
# the winner, then load_hint=nc_ef (x evict_first, late weight evict_last), one kernel at a time (~10 s each)
step rmsnorm-ef-f32 120 bash -c 'for h in nc nc_ef; do python3 lab/rmsnorm_profile.py --no-baseline --reps 40 float32 32768 8192 --params load_hint=$h,weight_load=late; done'
step rmsnorm-ef-bf16 120 bash -c 'for h in nc nc_ef; do python3 lab/rmsnorm_profile.py --no-baseline --reps 40 bfloat16 32768 8192 --params load_hint=$h; done'
# stage=pipe (persistent, double-buffered bulk copies; verify first: step rmsnorm-selftest has cases for it)
step rmsnorm-pipe 180 bash -c 'for m in 1 2; do for d in float32 bfloat16; do python3 lab/rmsnorm_profile.py --no-baseline --reps 40 $d 32768 8192 --params stage=pipe,weight_load=late,min_blocks=$m; done; done'
# session 6 probes (each shares the cache; winners become exact-scope lessons of the full build):
# bf16 64K-256K rows as 64 KB per CTA / two CTAs per SM; warp- and block-regime stage=pipe and nc_ef at 256-8K
step rmsnorm-probe-big 300 $PB -f lab/rmsnorm_probe_big.toml build rmsnorm@h200 --remeasure
step rmsnorm-probe-small 300 $PB -f lab/rmsnorm_probe_small.toml build rmsnorm@h200 --remeasure
step rmsnorm-probe-cluster 300 $PB -f lab/rmsnorm_probe_cluster.toml build rmsnorm@h200 --remeasure
step rmsnorm-probe-mid 400 $PB -f lab/rmsnorm_probe_mid.toml build rmsnorm@h200 --remeasure
# session 7: stage=chunk (two passes in chunks; torch.compile's own kernel shape, with its L1/L2
# eviction priorities). The probes first, so their winners seed the full build as lessons.
step rmsnorm-selftest-chunk 120 python3 benchmarks/rmsnorm_selftest_gpu.py -k chunk
step rmsnorm-probe-chunk 300 $PB -f lab/rmsnorm_probe_chunk.toml build rmsnorm@h200
step rmsnorm-probe-chunk-big 300 $PB -f lab/rmsnorm_probe_chunk_big.toml build rmsnorm@h200
step rmsnorm-probe-triton 300 $PB -f lab/rmsnorm_probe_triton.toml build rmsnorm@h200
step rmsnorm-remeasure 1800 $PB build rmsnorm@h200 --remeasure
step rmsnorm-bf16-remeasure 600 $PB -f benchmarks/rmsnorm_bf16.toml build rmsnorm@h200 --remeasure
step rmsnorm-vs-best-known 60 python3 benchmarks/rmsnorm_vs_best_known.py reports/rmsnorm@h200/report.json --out lab/bf16/vs-best-known.md
# what torch.compile runs at the rows still behind it (N = 512-1K): timings under ncu, and its PTX
step rmsnorm-small-triton 300 bash -c 'for n in 512 1024; do ncu --clock-control none -k "regex:rmsnorm_fwd|triton_" --launch-count 8 --metrics gpu__time_duration.sum,dram__bytes_read.sum,l1tex__t_sector_hit_rate.pct,launch__registers_per_thread,launch__block_size,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active python3 lab/rmsnorm_profile.py bfloat16 32768 $n --reps 2 --triton-ptx "'"$logs"'/triton-ptx-$n"; done'
# session 8: persistent clusters (stage=pipe, cluster regime; falsified, see ops/rmsnorm/NOTES.md run 15),
# the copy floor of the short rows, torch.compile's one-warp shape at 256-1K, then the whole matrix re-timed
step rmsnorm-selftest-pipe 150 python3 benchmarks/rmsnorm_selftest_gpu.py -k "'stage': 'pipe'"
step rmsnorm-probe-cpipe 330 $PB -f lab/rmsnorm_probe_cpipe.toml build rmsnorm@h200
step copy-floor 90 python3 benchmarks/copy_floor.py --report reports/rmsnorm@h200/report.json --out lab/bf16/copy-floor.md
step rmsnorm-probe-tiny 210 $PB -f lab/rmsnorm_probe_tiny.toml build rmsnorm@h200
step rmsnorm-probe-tiny32 120 $PB -f lab/rmsnorm_probe_tiny32.toml build rmsnorm@h200
step rmsnorm-probe-512 200 $PB -f lab/rmsnorm_probe_512.toml build rmsnorm@h200   # run 16a: no gain
step rmsnorm-remeasure-s8 900 $PB build rmsnorm@h200 --remeasure
step rmsnorm-vs-best-known-s8 60 python3 benchmarks/rmsnorm_vs_best_known.py reports/rmsnorm@h200/report.json --out lab/bf16/vs-best-known.md
# session 9: stage=bulk (verify, then probe), the short rows against a copy under four flush protocols,
# timing protocol 2 (the gate) on six rows, then the bf16 rows and the GPU tests
step rmsnorm-selftest-bulk 150 python3 benchmarks/rmsnorm_selftest_gpu.py -k "'stage': 'bulk'"
step rmsnorm-probe-bulk 270 $PB -f lab/rmsnorm_probe_bulk.toml build rmsnorm@h200
step rmsnorm-probe-bulk2 300 $PB -f lab/rmsnorm_probe_bulk2.toml build rmsnorm@h200
for f in fill memset read; do
  step short-row-$f 90 python3 benchmarks/short_row_overhead.py --rotate --flush $f --kinds copy1,winner --out lab/bf16/short-row-overhead-$f.md
done
step rmsnorm-gate 240 $PB -f lab/rmsnorm_gate.toml build rmsnorm@h200
step rmsnorm-bf16-protocol2 300 $PB -f benchmarks/rmsnorm_bf16.toml build rmsnorm@h200 --remeasure
step rmsnorm-vs-best-known-protocol2 60 python3 benchmarks/rmsnorm_vs_best_known.py reports/bf16/rmsnorm@h200/report.json --out lab/bf16/vs-best-known-protocol2.md
step pytest-gpu 200 python3 -m pytest -q -m gpu tests -rA -p no:cacheprovider
# session 10: how pacing moves the short rows (lab/bf16/pacing/), torch.compile's kernels, then
# timing protocol 3 (each call alone after a synchronized flush) and everything re-timed under it
S="python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --flush memset --reps 300 --ns 256,512,1024"
step pacing-sync 150 $S --kinds copy1,winner --ms 16384,32768,65536 --out lab/bf16/pacing/sync.md
step pacing-batch32 150 $S --kinds copy1,winner --ms 16384,32768,65536 --batch 32 --out lab/bf16/pacing/batch32.md
step pacing-cold-gated 90 $S --kinds copy1,winner,torch_compile --ms 32768 --cold --gate --out lab/bf16/pacing/cold-gated.md
step torch-kernel-shape 200 env TORCH_LOGS=output_code python3 lab/torch_kernel_shape.py --ns 256,512,1024,2048
step rmsnorm-remeasure-protocol3 900 $PB build rmsnorm@h200 --remeasure
step rmsnorm-vs-best-known-protocol3-full 60 python3 benchmarks/rmsnorm_vs_best_known.py reports/rmsnorm@h200/report.json --out lab/bf16/vs-best-known.md
step kda-protocol3 600 $PB -f lab/kda_protocol3.toml build kda@h200
step rmsnorm-probe-p3 170 $PB -f lab/rmsnorm_probe_p3.toml build rmsnorm@h200
step rmsnorm-bf16-protocol3 300 $PB -f benchmarks/rmsnorm_bf16.toml build rmsnorm@h200 --remeasure
step rmsnorm-vs-best-known-protocol3 60 python3 benchmarks/rmsnorm_vs_best_known.py reports/bf16/rmsnorm@h200/report.json --out lab/bf16/vs-best-known-protocol3.md
step pytest-gpu-protocol3 200 python3 -m pytest -q -m gpu tests -rA -p no:cacheprovider
# the experimental FAST_FRONT / FAST_SUM / W_EL / ROWWISE paths of rmsnorm.cu: verified, then timed against the
# winner (code: commit ddc6160; FAST_SUM and ROWWISE were removed after it, and an unknown -D is ignored)
step rmsnorm-selftest-fast 150 python3 benchmarks/rmsnorm_selftest_gpu.py -k "warp " -D FAST_FRONT=1 -D FAST_SUM=1
step fast-front 150 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 400 --ns 256,512 --ms 32768 --kinds winner,winner+FAST_FRONT=1,winner+FAST_FRONT=1+FAST_SUM=1,torch_compile,winner+FAST_FRONT=1+FAST_SUM=1,winner+FAST_FRONT=1,winner --flush memset --cold --gate --out lab/bf16/pacing/fast-front.md
step rmsnorm-selftest-wel-rowwise 100 python3 benchmarks/rmsnorm_selftest_gpu.py -k "warp " -D W_EL=1 -D ROWWISE=1 -D FAST_FRONT=1
step wel-rowwise 120 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 400 --ns 256,512 --ms 32768 --kinds winner,winner+W_EL=1,winner+ROWWISE=1,winner+FAST_FRONT=1+W_EL=1+ROWWISE=1,torch_compile,winner+FAST_FRONT=1+W_EL=1+ROWWISE=1,winner+ROWWISE=1,winner+W_EL=1,winner --flush memset --cold --gate --out lab/bf16/pacing/wel-rowwise.md
# torch.compile's Triton kernel for bf16 512 / 256 from its PTX, through our launcher, beside our winner and
# torch.compile itself, plus edits of that PTX (its weight hints off; .cs stores) to bisect (NOTES.md, run 18)
tp="--triton-ptx 512=$(ls lab/h200-logs/run15d-triton-ptx-512/*.ptx) --triton-ptx 256=$(ls lab/h200-logs/run15d-triton-ptx-256/*.ptx)"
step triton-ptx 300 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 400 --ns 512,256 --ms 32768 --kinds winner,triton_ptx,triton_ptx+plainw,triton_ptx+cs,torch_compile,triton_ptx+cs,triton_ptx+plainw,triton_ptx,winner $tp --flush memset --cold --gate --out lab/bf16/pacing/triton-ptx.md
for k in winner triton_ptx; do step ncu-512-$k 120 ncu --set full --clock-control none -k regex:'rmsnorm|triton_per' --launch-count 1 python3 benchmarks/short_row_overhead.py --reps 1 --ns 512 --ms 32768 --kinds $k $tp --flush memset --cold; done
# the one-warp, four-row shape at 256 (Triton's): its loads serialize without FAST_FRONT (run 18d-e)
step one-warp-256 150 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 400 --ns 256 --ms 32768 --kinds winner,winner:threads=32,triton_ptx,winner:threads=32,winner $tp --flush memset --cold --gate --out lab/bf16/pacing/one-warp-256.md
step rmsnorm-selftest-fast-front 100 python3 benchmarks/rmsnorm_selftest_gpu.py -k "warp " -D FAST_FRONT=1
step one-warp-fast-front 200 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 400 --ns 256 --ms 32768 --kinds winner,winner:threads=32+FAST_FRONT=1,winner+FAST_FRONT=1,triton_ptx,winner+FAST_FRONT=1,winner:threads=32+FAST_FRONT=1,winner $tp --flush memset --cold --gate --out lab/bf16/pacing/one-warp-fast-front.md
# the other rows torch.compile wins, under ncu beside torch.compile itself, Triton's PTX kept (run 18g)
for c in "bfloat16 256 --residual" "float16 512 --residual" "float32 512" "bfloat16 512 --residual"; do
  set -- $c; step ncu-$1-$2${3:+-res} 120 ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis -k regex:'rmsnorm_fwd|triton_' --launch-count 8 python3 lab/rmsnorm_profile.py $1 32768 $2 $3 --reps 2 --triton-ptx "$logs/triton-ptx-$1-$2${3:+-res}"
done
# run 19: the full matrix again with fast_front / w_el / min_blocks <= 32 in the search and polish (resumes when cut
# short), the bf16 rows alone, then H_LATE (residual_out stored after the reduction) verified and timed at the
# residual rows, mirrored (ops/rmsnorm/NOTES.md, run 19)
step rmsnorm-remeasure-19 1800 $PB build rmsnorm@h200 --remeasure
step rmsnorm-bf16-19 600 $PB -f benchmarks/rmsnorm_bf16.toml build rmsnorm@h200 --remeasure
step rmsnorm-selftest-h-late 90 python3 benchmarks/rmsnorm_selftest_gpu.py -k "'residual': True" -D H_LATE=1 -D FAST_FRONT=1
K=winner,winner+H_LATE=1,winner,winner+H_LATE=1,winner
mkdir -p lab/residual/pacing
step h-late-float16 80 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 400 --dtype float16 --residual --ns 512,1024 --ms 32768 --kinds $K --flush memset --cold --gate --out lab/residual/pacing/h-late-float16-residual.md
step h-late-bfloat16 80 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 400 --residual --ns 256,1024 --ms 32768 --kinds $K --flush memset --cold --gate --out lab/residual/pacing/h-late-bfloat16-residual.md
# run 19e: RSQ_FTZ (Triton's rsqrt.approx.ftz) beside the winner and torch.compile, mirrored
step rmsnorm-selftest-rsq-ftz 300 python3 benchmarks/rmsnorm_selftest_gpu.py -k "warp " -D RSQ_FTZ=1 -D FAST_FRONT=1
K=winner,winner+RSQ_FTZ=1,torch_compile,winner+RSQ_FTZ=1,winner
step rsq-ftz-float16 65 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 400 --dtype float16 --residual --ns 512 --ms 32768 --kinds $K --flush memset --cold --gate --out lab/residual/pacing/rsq-ftz-float16-residual.md
step rsq-ftz-bfloat16 65 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 400 --ns 512 --ms 32768 --kinds $K --flush memset --cold --gate --out lab/bf16/pacing/rsq-ftz.md
# run 20a-b: rmsnorm rebuilt with each baseline timed in the winner's window, and the playoff among near-ties
step rmsnorm-force-20 900 $PB build rmsnorm@h200 --force
# run 20d: does torch's reuse of one output block explain the short rows' gap? (rotated outputs vs one set)
mkdir -p lab/outputs
K=winner,torch_compile,winner
for fo in "" "--fixed-out"; do
  step outputs-float16-residual$fo 100 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate $fo --reps 300 --ms 32768 --kinds $K --flush memset --cold --gate --dtype float16 --residual --ns 256,512,1024 --out lab/outputs/float16-residual${fo:+-fixed-out}.md
  step outputs-bfloat16-residual$fo 100 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate $fo --reps 300 --ms 32768 --kinds $K --flush memset --cold --gate --dtype bfloat16 --residual --ns 256,512,1024 --out lab/outputs/bfloat16-residual${fo:+-fixed-out}.md
  step outputs-float32$fo 100 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate $fo --reps 300 --ms 32768 --kinds $K --flush memset --cold --gate --dtype float32 --ns 256,512,1024,2048 --out lab/outputs/float32${fo:+-fixed-out}.md
done
# run 20g: torch.compile's shape at 1K residual (one warp per row, fast_front) beside the winner
W1=winner:regime=warp:threads=32:rows_per_group=1:fast_front=true
mkdir -p lab/residual/warp-1k
for d in float16 bfloat16; do
  step warp-1k-$d-residual 80 python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 300 --ms 32768 --kinds winner,$W1,$W1:weight_load=late,torch_compile,$W1:weight_load=late,$W1,winner --flush memset --cold --gate --residual --ns 1024 --dtype $d --out lab/residual/warp-1k/$d-residual.md
done
# run 20f: the baselines timed again beside each winner, with their round-by-round ratios
step rmsnorm-force-20f 600 $PB build rmsnorm@h200 --force
# run 21 (at 9308fca; the macros H32 (690ca9e) and W_HOIST (fba6388) are in those commits' source only):
# the GPU tests, H32 and W_HOIST verified and timed, then torch.compile's residual kernels (its Triton
# PTX, kept from run 18g) through this repository's launcher
step gpu-tests 300 python3 -m pytest -q -m gpu tests
step rmsnorm-selftest-h32 300 python3 benchmarks/rmsnorm_selftest_gpu.py -k "'residual': True" -D H32=1 -D FAST_FRONT=1
step rmsnorm-selftest-w-hoist 300 python3 benchmarks/rmsnorm_selftest_gpu.py -D W_HOIST=1 -D FAST_FRONT=1
S="python3 benchmarks/short_row_overhead.py --report reports/rmsnorm@h200/report.json --rotate --reps 300 --ms 32768 --flush memset --cold --gate"
mkdir -p lab/residual/h32 lab/residual/w-hoist lab/residual/triton-ptx
for d in float16 bfloat16; do
  step h32-$d-residual 120 $S --kinds winner,winner+H32=1,winner:weight_load=early+H32=1,torch_compile,winner:weight_load=early+H32=1,winner+H32=1,winner --residual --ns 256,512,1024 --dtype $d --out lab/residual/h32/$d-residual.md
  for r in --residual ""; do
    step w-hoist-$d$r 100 $S --kinds winner,winner+W_HOIST=1,winner:weight_load=late+W_HOIST=1,torch_compile,winner:weight_load=late+W_HOIST=1,winner+W_HOIST=1,winner $r --ns 256,512 --dtype $d --out lab/residual/w-hoist/$d${r:+-residual}.md
  done
done
T=winner,triton_ptx,triton_ptx+nc,torch_compile,triton_ptx+nc,triton_ptx,winner
tp() { echo "--triton-ptx $1=$(ls lab/h200-logs/run18g-$2-$1-res-triton-ptx/*.ptx)"; }
step triton-ptx-float16-residual 120 $S --kinds $T --residual --ns 512 --dtype float16 $(tp 512 float16) --out lab/residual/triton-ptx/float16-residual.md
step triton-ptx-bfloat16-residual 120 $S --kinds $T --residual --ns 256,512 --dtype bfloat16 $(tp 256 bfloat16) $(tp 512 bfloat16) --out lab/residual/triton-ptx/bfloat16-residual.md
# run 21g: Triton's order of memory operations in our code (needs fba6388's rmsnorm.cu for W_HOIST)
for d in float16 bfloat16; do
  step triton-order-$d-residual 140 $S --kinds winner,winner+H_LATE=1+W_HOIST=1,winner:weight_load=early+H_LATE=1,torch_compile,winner:weight_load=early+H_LATE=1,winner+H_LATE=1+W_HOIST=1,winner --residual --ns 256,512,1024 --dtype $d --out lab/residual/triton-order/$d-residual.md
done
# run 21k: the short rows beside a plain copy of the same bytes
for d in bfloat16 float16; do
  step copy-$d-residual 60 $S --kinds copy1,winner,torch_compile,winner,copy1 --residual --ns 256,512,1024 --dtype $d --out lab/residual/copy/$d-residual.md
done
step copy-float32 60 $S --kinds copy1,winner,torch_compile,winner,copy1 --ns 512,2048 --dtype float32 --out lab/residual/copy/float32.md
# run 22a: the rows torch.compile still wins by 0.3-0.9% in every round, under ncu (current winners):
# per-SM active cycles (min / avg / max against elapsed: ramp-up and tail) and the bytes each moves
M22=gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_blocks,smsp__inst_executed.sum
for c in "float16 512 --residual" "bfloat16 1024 --residual" "bfloat16 512" "float32 2048"; do
  set -- $c; step ncu22-$1-$2${3:+-res} 150 ncu --clock-control none --metrics $M22 -k regex:'rmsnorm_fwd|triton_' --launch-count 8 python3 lab/rmsnorm_profile.py $1 32768 $2 $3 --reps 2
done
# run 22b: x and residual streamed through L2 with evict_first (load_hint=nc_ef, the weight kept out of
# that policy: w_el or a late weight), at the 8 rows torch.compile wins in every round (22a: ours
# writes 1.5-4 MB more to DRAM inside the kernel at bf16 1K residual)
E=winner,winner:load_hint=nc_ef:w_el=true,winner:load_hint=nc_ef:weight_load=late,torch_compile,winner:load_hint=nc_ef:weight_load=late,winner:load_hint=nc_ef:w_el=true,winner
for d in bfloat16 float16; do
  step ef-$d-residual 150 $S --kinds $E --residual --ns 256,512,1024 --dtype $d --out lab/residual/evict-first/$d-residual.md
  step ef-$d 60 $S --kinds $E --ns 512 --dtype $d --out lab/residual/evict-first/$d.md
done
step ef-float32 60 $S --kinds winner,winner:load_hint=nc_ef,torch_compile,winner:load_hint=nc_ef,winner --ns 2048 --dtype float32 --out lab/residual/evict-first/float32.md
# next (not yet run): all six KDA problems under protocol 3 (ops/kda/NOTES.md)
step kda-remeasure-protocol3 900 $PB build kda@h200 --remeasure
step mma-probe 120 python3 lab/mma_probe.py --json "$logs/mma-probe.json"   # mma.sync latency vs issue rate (KDA notes)
step kda 900 python3 benchmarks/kda_bench_gpu.py --quick
# kda.md's whole case list (T = 131072, H = 32, 8192 x H4, many tiny segments) with the default config
step kda-cases 900 python3 benchmarks/kda_bench_gpu.py --prep-variant 1 --no-fla
step kda-profile 180 python3 lab/kda_profile.py --H 96   # prepare / recurrence / both, stage by stage
step kda-compact 300 python3 benchmarks/kda_bench_gpu.py --quick --no-fla --prep-variant 1 --params prep_compact=1   # 6 prepare blocks per SM: verify,
step kda-compact-profile 180 python3 lab/kda_profile.py --H 96 --params prep_compact=1                 # then time (NOTES.md)
step kda-ksplit 300 python3 benchmarks/kda_bench_gpu.py --quick --no-fla --prep-variant 1 --params ksplit=2   # 2 warps per 16 rows:
step kda-ksplit-profile 180 python3 lab/kda_profile.py --H 96 --params ksplit=2                     # verify, then time
step kda-stages 900 $PB build kda_prepare@h200 kda_recurrence@h200   # runs 24a-c: both 6/6 and locked, ~13 min cold
step kda-stages-inputs 120 python3 -m pytest -q -m gpu tests/test_kda_stages.py -rA -p no:cacheprovider   # run 24a: batched workspace, cupy = numpy
# the whole forward (prepare + recurrence as one op) verified, timed, beside FLA's chunk_kda: issue #5's
# report (6 problems; FLA's Triton autotuning costs ~80-110 s per new problem on a cold machine, a
# candidate ~5-10 s; resumes from the cache if cut short), then H32 / H16 at T = 8192
step kda-build 2700 $PB build kda@h200
step kda-heads-build 900 $PB build kda_heads@h200
tail -n 3 "$logs"/*.log
