#!/usr/bin/env bash
# User-space instructions per payload byte, per side, of the engine over sim
# with 1 and with 2 shards per side (benches/src/bin/multicore.rs): the
# noise-free half of the multi-core figure (docs/architecture.md §9).
#
#   benches/multicore-callgrind.sh            (BYTES=64 MiB by default: MIB=64)
#
# Method as benches/callgrind.sh: each run twice, with MIB and with 0 MiB, the
# difference divided by the bytes (setup cancelled out); idle shards sleep on
# their waker (--idle sleep), so idle polls are hardly counted; valgrind
# serialises the threads, so what this shows is the work added by sharding
# (more connections, more polls), not lock contention or cache-line traffic —
# the wall-clock runs show those. Thread files: -01 main, then (after the sim
# wire thread, if the fabric started one) the N server shards, then the N
# client shards: the last 2N files.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.cpu.x86_rep_movsb_threshold=1073741824}
export BENCH_TUNE=${BENCH_TUNE:-idle=60000}
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${MIB:-64}
OUT=${OUT:-benches/results/callgrind-multicore}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p quic-rdma-benches --bin multicore
BIN="$CARGO_TARGET_DIR/release/multicore"
mkdir -p "$OUT"
totals() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }
# sum_side <prefix> <first thread> <count>
sum_side() {
  local t=0 i
  for ((i = $2; i < $2 + $3; i++)); do t=$((t + $(totals "$(printf '%s-%02d' "$1" "$i")"))); done
  echo $t
}
printf '%-7s %14s %14s %10s %10s\n' shards client_Ir server_Ir client/B server/B | tee "$OUT/summary.txt"
for n in 1 2; do
  for m in 0 "$MIB"; do
    rm -f "$OUT/s$n.$m".cg*
    valgrind --tool=callgrind --separate-threads=yes --dump-instr=no \
      --callgrind-out-file="$OUT/s$n.$m.cg" \
      "$BIN" --provider sim --shards "$n" --rounds 1 --mib "$m" --idle sleep >"$OUT/s$n.$m.log" 2>&1
  done
  # side <run> <0 server | 1 client> -> that side's Ir
  side() {
    local files first
    files=$(ls "$OUT/s$n.$1.cg"-* | wc -l)
    first=$((files - 2 * n + 1 + $2 * n))
    sum_side "$OUT/s$n.$1.cg" "$first" "$n"
  }
  s=$(( $(side "$MIB" 0) - $(side 0 0) ))
  c=$(( $(side "$MIB" 1) - $(side 0 1) ))
  b=$((MIB << 20))
  printf '%-7s %14d %14d %10.3f %10.3f\n' "$n" "$c" "$s" \
    "$(echo "$c / $b" | bc -l)" "$(echo "$s / $b" | bc -l)" | tee -a "$OUT/summary.txt"
done
