#!/usr/bin/env bash
# Tail latency against the floors, rows interleaved: is a row's tail its own,
# or the machine's?
#
#   benches/tails.sh [ROW ...]     (default: raw-ud/sim quinn-proto/ideal engine/sim tcp+rustls+spin)
#   ROUNDS=3 ITERS=100000 PLACE=separate-cores OUT=benches/results/tails benches/tails.sh
#
# Each round runs every row once (`bulk-once --rtt ITERS --samples`, 64-byte
# request/response after 1000 warm-up round trips) and keeps each sampled
# round trip in order. The table gives p50, p99 and p99.9 per run and each
# tail as a multiple of its own p50. `raw-ud/sim` (no QUIC, no crypto) is
# the machine's floor and `quinn-proto/ideal` quinn-proto's own: a row whose
# p99/p50 matches theirs adds no tail of its own; one well above them does.
# "bursts" is the share of slow round trips (> 2× the run's p50) that
# follow another slow one: high when the machine stalls the thread (a
# hypervisor or scheduler hiccup spans several round trips), low when the
# slow work is spread out, one round trip at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-100000}
PLACE=${PLACE:-separate-cores}
OUT=${OUT:-benches/results/tails}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p quic-rdma-benches --bin bulk-once
BIN="$CARGO_TARGET_DIR/release/bulk-once"
if [ $# -gt 0 ]; then ROWS=("$@"); else ROWS=(raw-ud/sim quinn-proto/ideal engine/sim tcp+rustls+spin); fi
mkdir -p "$OUT"
exec > >(tee "$OUT/summary.txt")
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD) load: $(cut -d' ' -f1-3 /proc/loadavg) placement: $PLACE"
for r in $(seq 1 "$ROUNDS"); do
  for row in "${ROWS[@]}"; do
    "$BIN" --peer "$row" --rtt "$ITERS" --placement "$PLACE" \
      --samples "$OUT/${row//\//_}.$r.txt" >/dev/null
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" "$ROUNDS" "${ROWS[@]}" <<'PY'
import sys
out, rounds, rows = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"{'row':22s} {'run':>3s} {'p50 µs':>7s} {'p99 µs':>7s} {'×p50':>5s} {'p99.9 µs':>9s} {'×p50':>5s} {'bursts':>6s}")
for row in rows:
    for r in range(1, rounds + 1):
        seq = [int(l) for l in open(f"{out}/{row.replace('/', '_')}.{r}.txt")]
        s = sorted(seq)
        n = len(s)
        p50, p99, p999 = s[n // 2], s[int(n * 0.99)], s[int(n * 0.999)]
        slow = [i for i, v in enumerate(seq) if v > 2 * p50]
        burst = sum(1 for a, b in zip(slow, slow[1:]) if b == a + 1) / max(len(slow), 1)
        print(f"{row:22s} {r:3d} {p50/1e3:7.1f} {p99/1e3:7.1f} {p99/p50:5.1f} {p999/1e3:9.1f} {p999/p50:5.1f} {burst:6.2f}")
PY
