#!/bin/bash
# On a lent GPU machine after scripts/gpu/run.sh built the extension: Nsight Compute's speed of
# light, memory, warp-state and occupancy sections for our decode kernel and SDPA's (second
# launch of each), into $OUT/ncu_ours.txt and $OUT/ncu_sdpa.txt.
set -u
OUT=${OUT:-build/gpu}
export PYTHONPATH=$PWD LD_LIBRARY_PATH=$PWD/.gpu/cbc/lib:${LD_LIBRARY_PATH:-}
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats"
timeout 150 ncu --clock-control none --kernel-name regex:DecodeKernel --launch-skip 1 --launch-count 1 \
  $sections python3 scripts/gpu/profile_decode.py > "$OUT/ncu_ours.txt" 2>&1
timeout 150 ncu --clock-control none --kernel-name "regex:(?i)(flash|fmha|attn|attention)" \
  --launch-skip 1 --launch-count 1 $sections python3 scripts/gpu/profile_decode.py \
  > "$OUT/ncu_sdpa.txt" 2>&1
for f in ncu_ours ncu_sdpa; do
  echo "== $f"; grep -E "^  [A-Za-z].*(\(|kernel)|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers|Stall|Warp Cycles Per Issued|Block Size|Grid Size" "$OUT/$f.txt" | head -24
done
