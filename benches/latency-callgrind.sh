#!/usr/bin/env bash
# Instructions, allocations and packets of one 64-byte request/response round
# trip, per side and per function (issue 29: where QUIC's per-round-trip cost goes).
#
#   benches/latency-callgrind.sh [ROW ...]   (default: engine/sim quinn-proto/ideal raw-ud/sim)
#   N1=1000 N2=6000 OUT=benches/results/latency-callgrind benches/latency-callgrind.sh engine/sim
#
# Method: `bulk-once --peer ROW --rtt N` runs the RTT workload (1000 warm-up
# round trips, then N sampled) with the server in thread 2 and the client in
# thread 3, both on one core, an idle engine side sleeping on its waker (as
# benches/callgrind.sh does, so idle polls are not counted as work);
# `valgrind --tool=callgrind --separate-threads=yes` counts each thread's
# user-space instructions. Each row runs with N1 and N2 round trips;
# benches/callgrind_rtt.py subtracts the two and divides by N2 - N1, which
# cancels start-up, handshake, warm-up and close, and writes OUT/<row>.md
# (per category, entry point and function; malloc/free calls; packets each
# side sent, from quinn-proto's statistics) and OUT/summary.txt.
# Instruction counts do not depend on the machine's load.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.cpu.x86_rep_movsb_threshold=1073741824}
# Slowed ~50x under valgrind: a 60 s idle timeout instead of the rows' 1.5 s.
export BENCH_TUNE=${BENCH_TUNE:-idle=60000}
set -euo pipefail
cd "$(dirname "$0")/.."
N1=${N1:-1000}
N2=${N2:-6000}
OUT=${OUT:-benches/results/latency-callgrind}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p quic-rdma-benches --bin bulk-once
BIN="$CARGO_TARGET_DIR/release/bulk-once"
mkdir -p "$OUT"
if [ $# -gt 0 ]; then ROWS=("$@"); else ROWS=(engine/sim quinn-proto/ideal raw-ud/sim); fi
{
  echo "# per round trip (run N2=$N2 - run N1=$N1) / $((N2 - N1)); client/server; BENCH_TUNE=$BENCH_TUNE"
  for row in "${ROWS[@]}"; do
    tag=${row//\//_}
    for n in "$N1" "$N2"; do
      rm -f "$OUT/$tag.$n".cg*
      valgrind --tool=callgrind --separate-threads=yes --dump-instr=no \
        --callgrind-out-file="$OUT/$tag.$n.cg" \
        "$BIN" --peer "$row" --rtt "$n" --placement same-core --idle sleep >"$OUT/$tag.$n.json" 2>"$OUT/$tag.$n.log" \
        || { echo "$row ($n round trips) failed: see $OUT/$tag.$n.log" >&2; continue 2; }
    done
    python3 benches/callgrind_rtt.py "$row" "$OUT" "$tag" "$N1" "$N2"
    # The profiles are large and reproducible: keep the tables and logs only.
    rm -f "$OUT/$tag".*.cg*
  done
} | tee "$OUT/summary.txt"
