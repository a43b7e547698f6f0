#!/usr/bin/env bash
# User-space instructions per payload byte, per side, for each row's bulk transfer.
#
#   benches/callgrind.sh [ROW ...]          (default: every row `bulk-once --list` prints)
#   BYTES=64M OUT=benches/results/callgrind benches/callgrind.sh engine/sim tcp
#
# Method: `bulk-once` runs the server in thread 2 and the client in thread 3;
# `valgrind --tool=callgrind --separate-threads=yes` counts each thread's
# instructions (Ir: user space only, deterministic). Each row runs twice, with
# BYTES and with 0 bytes; the difference divided by BYTES is the per-byte cost
# with connection setup, certificates and runtime start-up cancelled out.
# Sides run on one core and an idle engine side sleeps on its waker (--idle
# sleep; valgrind serialises threads anyway), so idle polls are not counted.
# The receiver copies into a scratch buffer and does not hash (no --verify).
# glibc's memcpy copies blocks above `x86_rep_movsb_threshold` (4 KiB here)
# with `rep movsb`, which callgrind counts as one instruction per byte, and
# smaller ones with a vector loop (~0.1 per byte): the same bytes copied would
# count 10x apart by block size. The tunable below keeps every size on the
# vector loop, so copies count by bytes copied, whatever their size.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.cpu.x86_rep_movsb_threshold=1073741824}
# Under valgrind a side runs ~50x slower, and starved on a loaded machine it
# can pass quinn rows' 1.5 s idle timeout: 60 s instead (keep-alives are a
# handful of packets either way).
export BENCH_TUNE=${BENCH_TUNE:-idle=60000}
# Top self-cost functions of each side go to OUT/<row>.<side>.top.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
BYTES=${BYTES:-64M}
OUT=${OUT:-benches/results/callgrind}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p quic-rdma-benches --bin bulk-once
BIN="$CARGO_TARGET_DIR/release/bulk-once"
mkdir -p "$OUT"
exec > >(tee "$OUT/summary.txt")
if [ $# -gt 0 ]; then ROWS=("$@"); else mapfile -t ROWS < <("$BIN" --list); fi
bytes_num=$(python3 -c "import sys;s=sys.argv[1];m={'K':10,'M':20,'G':30};print(int(s[:-1])<<m[s[-1].upper()] if s[-1].upper() in m else int(s))" "$BYTES")

# totals <callgrind file> -> Ir of that thread
totals() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }

printf '%-20s %14s %14s %10s %10s\n' row client_Ir server_Ir client/B server/B
for row in "${ROWS[@]}"; do
  tag=${row//\//_}
  for b in 0 "$BYTES"; do
    rm -f "$OUT/$tag.$b".cg*
    valgrind --tool=callgrind --separate-threads=yes --dump-instr=no \
      --callgrind-out-file="$OUT/$tag.$b.cg" \
      "$BIN" --peer "$row" --bytes "$b" --placement same-core --idle sleep >"$OUT/$tag.$b.log" 2>&1 \
      || { echo "$row ($b bytes) failed: see $OUT/$tag.$b.log" >&2; continue 2; }
  done
  # Thread files: -01 main (setup), -02 server, -03 client.
  s0=$(totals "$OUT/$tag.0.cg-02"); c0=$(totals "$OUT/$tag.0.cg-03")
  s1=$(totals "$OUT/$tag.$BYTES.cg-02"); c1=$(totals "$OUT/$tag.$BYTES.cg-03")
  python3 - "$row" "$c0" "$c1" "$s0" "$s1" "$bytes_num" <<'PY'
import sys
row, c0, c1, s0, s1, n = sys.argv[1], *map(int, sys.argv[2:])
print(f"{row:20s} {c1-c0:14d} {s1-s0:14d} {(c1-c0)/n:10.2f} {(s1-s0)/n:10.2f}")
PY
  for side in client:03 server:02; do
    callgrind_annotate --inclusive=no "$OUT/$tag.$BYTES.cg-${side#*:}" 2>/dev/null \
      | head -45 >"$OUT/$tag.${side%:*}.top.txt" || true
  done
done
