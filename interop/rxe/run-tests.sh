#!/usr/bin/env bash
# The verbs provider's test entry point (CI calls this): installs what it needs
# (apt-get), builds the provider and its tests on the host, runs the host-side
# tests, then boots the rxe guest twice (rxe0 on lo; rxe0 on a 1500-MTU dummy
# netdev) and runs the guest suite. Exits non-zero on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"
t0=$(date +%s)
log() { echo "[run-tests] $*" >&2; }

# Build dependencies of rdma-sys (bindgen over libibverbs/librdmacm headers).
need=()
for p in libibverbs-dev librdmacm-dev libclang-dev pkg-config; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") >&2
fi

log "building quic-rdma with --features verbs"
cargo test -p quic-rdma --features verbs --no-run --message-format=json \
  --lib --test verbs_raw --test verbs_quic --test verbs_ud_pingpong >"${TMPDIR:-/tmp}/verbs-build.json"
exe() { # executable of a test target
  python3 -c '
import json,sys
for l in open(sys.argv[1]):
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]==sys.argv[2] and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' "${TMPDIR:-/tmp}/verbs-build.json" "$1" | tail -1
}
LIB="$(exe quic_rdma)"; RAW="$(exe verbs_raw)"; QUIC="$(exe verbs_quic)"; PP="$(exe verbs_ud_pingpong)"
[[ -x "$LIB" && -x "$RAW" && -x "$QUIC" && -x "$PP" ]] || { log "test executables not found"; exit 1; }

pass=0; fail=0
step() { # name, command...
  local name="$1"; shift
  log "=== $name"
  local s=$(date +%s)
  if "$@"; then pass=$((pass+1)); log "--- PASS $name ($(( $(date +%s) - s )) s)"
  else fail=$((fail+1)); log "--- FAIL $name ($(( $(date +%s) - s )) s)"; fi
}
step "host: verbs unit tests (no RDMA here -> NoDevice)" "$LIB" fabric::verbs
step "guest (rxe0 on lo): rdma-core tools, raw UD, ibv_ud_pingpong interop, QUIC 64 MiB" \
  "$HERE/run.sh" --timeout 900 "$HERE/guest-suite.sh" "$RAW" "$QUIC" "$PP"
step "guest (rxe0 on a 1500-MTU netdev): MTU 1024 -> MtuTooSmall" \
  "$HERE/run.sh" --netdev dummy1500 --timeout 300 --env QR_REQUIRE_RDMA=1 --env QR_EXPECT_MTU=1024 \
  "$RAW" limits_read_from_the_device --nocapture
log "total $(( $(date +%s) - t0 )) s"
echo "verbs: $pass passed, $fail failed"
[[ $fail == 0 ]]
