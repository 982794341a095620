#!/bin/bash
# On a lent GPU machine (the device tool), from the repository root, with .gpu/ carried
# (scripts/gpu/prepare.sh): builds torch_plugin._C with its CUDA kernels, then runs
# benchmarks/gpu_kernels.py and scripts/gpu/check_paths.py. Logs and JSON go to $OUT.
set -u
OUT=${OUT:-build/gpu}
mkdir -p "$OUT"
export PATH=$PWD/.gpu/bin:$PATH PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export LD_LIBRARY_PATH=$PWD/.gpu/cbc/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
t0=$(date +%s)
if [ "${SKIP_BUILD:-0}" != 1 ] && ! TP_CUDA=1 MAX_JOBS=16 timeout "${BUILD_S:-240}" python3 setup.py build_ext --inplace \
    > "$OUT/build.log" 2>&1; then
  grep -E "error|Error" "$OUT/build.log" | head -30; tail -15 "$OUT/build.log"; exit 1
fi
echo "build: $(( $(date +%s) - t0 )) s"
# Which copy instructions the decode kernels hold (UTMALDG: TMA; LDGSTS: cp.async).
cuobjdump --dump-sass torch_plugin/_C*.so 2>/dev/null | grep -oE "UTMALDG|LDGSTS|SYNCS\.[A-Z.]+" \
  | sort | uniq -c | tr '\n' ' '; echo
[ "${SKIP_KERNELS:-0}" = 1 ] || timeout "${KERNELS_S:-150}" python3 benchmarks/gpu_kernels.py \
  --out "$OUT" 2>&1 | tee "$OUT/kernels.log"
# The tests that need a GPU (they skip on the CPU machine).
[ -n "${GPU_TESTS:-}" ] && timeout "${GPU_TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider \
  $GPU_TESTS 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
# Why the CUDA-graph candidate fails on decoders' graphs (small configs, seconds).
[ "${PROBE:-0}" = 1 ] && timeout "${PROBE_S:-120}" python3 scripts/gpu/probe_capture.py 2>&1 \
  | grep -v "^W1" | tee "$OUT/probe.log"
# The default compile against Inductor on six HF models at real sizes (issue 40, item 3).
[ "${DEFAULT_COMPILE:-0}" = 1 ] && timeout "${DEFAULT_COMPILE_S:-330}" python3 \
  benchmarks/gpu_default_compile.py --out "$OUT" --budget-s "${DC_BUDGET_S:-240}" \
  ${DC_MODELS:+--models $DC_MODELS --merge} ${DC_BATCHES:+--batches $DC_BATCHES} 2>&1 \
  | grep -v "^W1" | tee "$OUT/default_compile.log"
[ "${SKIP_CHECKS:-0}" = 1 ] && { echo "total: $(( $(date +%s) - t0 )) s"; exit 0; }
# Each check alone: a crash in one leaves the others their say.
for check in ${CHECKS:-placement placement_refine placement_bert default_compile parallelize_nccl generate_nccl dropout_replay}; do
  PYTHONFAULTHANDLER=1 timeout "${CHECK_S:-90}" python3 -m torch.distributed.run \
    --nproc-per-node 1 scripts/gpu/check_paths.py --out "$OUT" --only "$check" 2>&1 \
    | grep -v "^W1\|Warning\|^ *File \"/opt\|^Extension modules" | tail -25 >> "$OUT/paths.log"
  grep "^\[ok\]\|^\[FAIL\]" "$OUT/paths.log" | tail -1
done
echo "total: $(( $(date +%s) - t0 )) s"
