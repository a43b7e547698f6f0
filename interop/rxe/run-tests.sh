#!/usr/bin/env bash
# The verbs provider's test entry point (CI calls this): installs what it needs
# (apt-get), builds the provider and its tests on the host, runs the host-side
# tests, then boots the rxe guest: rxe0 on lo (the guest suite), rxe0 on a 1500-MTU
# dummy netdev (the MTU error; run from a directory under /tmp, which the guest must
# see as the host does), and four times with rxe0 on a virtio NIC linked by a
# tap to the host (in a network namespace run.sh creates): rdma-core's ibv_ud_pingpong
# <-> qr ud-pingpong --provider soft and QUIC soft <-> verbs, each side in each role,
# an image blob pulled by a verbs node agent from a soft registry agent, and
# the host's aioquic through a verbs `qr gateway to-fabric` to a verbs `qr serve`.
# Also builds qr with --features verbs. Exits non-zero on any failure.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
cd "$ROOT"
t0=$(date +%s)
log() { echo "[run-tests] $*" >&2; }

# Build dependencies of rdma-sys (bindgen over libibverbs/librdmacm headers).
need=()
# curl: the image step's guest half GETs the blob from its node agent.
for p in libibverbs-dev librdmacm-dev libclang-dev pkg-config curl; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") >&2
fi

# Release builds: they reuse the dependencies the workspace test step already built,
# and the emulated guest runs optimised code faster. (The one debug build below
# has no debug info: a full-debug second copy of every dependency is what once
# ran a CI machine's small disk out of space.)
log "building quic-rdma with --features verbs"
cargo test --release -p quic-rdma --features verbs --no-run --message-format=json \
  --lib --test verbs_raw --test verbs_quic --test verbs_ud_pingpong >"${TMPDIR:-/tmp}/verbs-build.json"
exe() { # executable of test target $1 in cargo's JSON build log $2 (default: the build above)
  python3 -c '
import json,sys
for l in open(sys.argv[1]):
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]==sys.argv[2] and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' "${2:-${TMPDIR:-/tmp}/verbs-build.json}" "$1" | tail -1
}
LIB="$(exe quic_rdma)"; RAW="$(exe verbs_raw)"; QUIC="$(exe verbs_quic)"; PP="$(exe verbs_ud_pingpong)"
[[ -x "$LIB" && -x "$RAW" && -x "$QUIC" && -x "$PP" ]] || { log "test executables not found"; exit 1; }

# The quinn-adapter transfer once more, built as plain `cargo test` builds it
# (the test profile: debug assertions and overflow checks on), where a
# connection loss was once seen only (docs/architecture.md §2). No debug info:
# it is what fills a small CI disk, and nothing here reads it.
log "building verbs_quic in the test profile (debug assertions, overflow checks)"
CARGO_PROFILE_DEV_DEBUG=0 cargo test -p quic-rdma --features verbs --no-run --message-format=json \
  --test verbs_quic >"${TMPDIR:-/tmp}/verbs-debug-build.json"
QUIC_DEBUG="$(exe verbs_quic "${TMPDIR:-/tmp}/verbs-debug-build.json")"
[[ -x "$QUIC_DEBUG" ]] || { log "verbs_quic (test profile) not built"; exit 1; }

log "building qr with --features verbs"
cargo build --release -p quic-rdma-tools --features verbs --message-format=json >"${TMPDIR:-/tmp}/qr-verbs-build.json"
QR="$(python3 -c '
import json,sys
for l in open(sys.argv[1]):
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="qr" and m.get("executable"):
        print(m["executable"])' "${TMPDIR:-/tmp}/qr-verbs-build.json" | tail -1)"
# A copy of its own: a later default build would overwrite target/release/qr.
cp "$QR" "$QR-verbs"; QR="$QR-verbs"
[[ -x "$QR" ]] || { log "qr not built"; exit 1; }

# The C API over verbs: the static library built with its `verbs` feature, and
# the C latency example (quic-rdma-ffi/examples/latency.c) linked against it.
log "building the C library with --features verbs and the C latency example"
cargo build --release -p quic-rdma-ffi --features verbs --message-format=json >"${TMPDIR:-/tmp}/ffi-verbs-build.json"
FFI_A="$(python3 -c '
import json,sys
for l in open(sys.argv[1]):
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="quic_rdma_ffi":
        for f in m["filenames"]:
            if f.endswith(".a"): print(f)' "${TMPDIR:-/tmp}/ffi-verbs-build.json" | tail -1)"
[[ -f "$FFI_A" ]] || { log "libquic_rdma_ffi.a (verbs) not built"; exit 1; }
LAT="$(dirname "$FFI_A")/latency-verbs"
cc -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -O2 \
  -I"$ROOT/quic-rdma-ffi/include" -I"$ROOT/quic-rdma-ffi/examples" \
  "$ROOT/quic-rdma-ffi/examples/latency.c" "$FFI_A" \
  -libverbs -lpthread -ldl -lm -lrt -lgcc_s -lutil -lc -o "$LAT"

# The host half of each QUIC step shares the guest half's timers (guest-net.sh):
# the guest runs emulated and may stall for seconds.
QR_LIVENESS="--idle-timeout 30s --keep-alive 1s"

pass=0; fail=0
step() { # name, command...
  local name="$1"; shift
  log "=== $name"
  local s=$(date +%s)
  if "$@"; then pass=$((pass+1)); log "--- PASS $name ($(( $(date +%s) - s )) s)"
  else fail=$((fail+1)); log "--- FAIL $name ($(( $(date +%s) - s )) s)"; fi
}
step "host: verbs unit tests (no RDMA here -> NoDevice)" "$LIB" fabric::verbs
no_device_from_c() { # the C API names the missing device and the fix
  ! "$LAT" --serve 127.0.0.1 /dev/null --provider verbs 2>"${TMPDIR:-/tmp}/lat-nodev.txt" &&
    grep -q "no RDMA device" "${TMPDIR:-/tmp}/lat-nodev.txt" && cat "${TMPDIR:-/tmp}/lat-nodev.txt"
}
step "host: the C API on verbs without a device -> QR_ENODEVICE naming the fix" no_device_from_c
step "guest (rxe0 on lo): rdma-core tools, raw UD, ibv_ud_pingpong interop (library + qr ud-pingpong --provider verbs), QUIC 64 MiB" \
  "$HERE/run.sh" --timeout 900 "$HERE/guest-suite.sh" "$RAW" "$QUIC" "$PP" "$QR" "$LAT"
step "guest (rxe0 on lo), test profile (debug assertions): QUIC over verbs through the quinn adapter, handshake + 64 MiB, sha256 equal" \
  "$HERE/run.sh" --timeout 900 --env QR_REQUIRE_RDMA=1 \
  "$QUIC_DEBUG" quic_handshake_and_64mib_transfer_verbs_to_verbs --exact --nocapture
# This one runs from a directory under the host's /tmp, with the test binary copied
# there: the guest's /tmp shows the host's beneath its own writes (init.sh), so a
# checkout or target dir under /tmp works like any other path.
UNDER_TMP="$(mktemp -d /tmp/qr-rxe-tmpcheck.XXXXXX)"
trap 'rm -rf "$UNDER_TMP"' EXIT
cp "$RAW" "$UNDER_TMP/verbs_raw"
under_tmp() { (cd "$UNDER_TMP" && "$@"); }
step "guest (rxe0 on a 1500-MTU netdev), run from $UNDER_TMP: MTU 1024 -> segmented (MtuTooSmall with segmentation off); async events wake readiness_fd" \
  under_tmp "$HERE/run.sh" --netdev dummy1500 --timeout 300 --env QR_REQUIRE_RDMA=1 --env QR_EXPECT_MTU=1024 \
  ./verbs_raw limits_read_from_the_device readiness_fd_turns_readable_on_an_async_event --nocapture
# Host <-> guest over a tap in a namespace run.sh creates (--netdev tap): the host is
# `soft` (10.77.0.1), the guest rxe0 on its eth0 (10.77.0.2); run.sh --host runs the
# host half inside that namespace. Each pair runs both roles.
TAP=("$HERE/run.sh" --netdev tap --timeout 900)
step "tap: ibv_ud_pingpong server (guest rxe) <-> qr ud-pingpong --provider soft client (host)" \
  "${TAP[@]}" --env PP_SIZE=1024 --env PP_ITERS=500 \
  --host "$QR ud-pingpong --provider soft --ip 10.77.0.1 -s 1024 -n 500 --wait 300 --timeout 120 10.77.0.2" \
  "$HERE/guest-net.sh" pp-server
step "tap: ibv_ud_pingpong client (guest rxe) <-> qr ud-pingpong --provider soft server (host)" \
  "${TAP[@]}" --env PP_SIZE=4096 --env PP_ITERS=500 \
  --host "$QR ud-pingpong --provider soft --ip 10.77.0.1 -s 4096 -n 500 --timeout 600" \
  "$HERE/guest-net.sh" pp-client
step "tap: QUIC 16 MiB, qr connect --provider soft (host) -> qr serve --provider verbs (guest rxe)" \
  "${TAP[@]}" \
  --host "$QR connect --provider soft --ip 10.77.0.1 --cert \$RXE_XFER/cert.der --bytes 16M --pings 200 --wait 300 --timeout 600 $QR_LIVENESS 10.77.0.2:18515" \
  "$HERE/guest-net.sh" quic-server "$QR"
step "tap: QUIC 16 MiB, qr connect --provider verbs (guest rxe) -> qr serve --provider soft (host)" \
  "${TAP[@]}" --env QUIC_BYTES=16M \
  --host "$QR serve --provider soft --ip 10.77.0.1 --cert-out \$RXE_XFER/cert.der --once --timeout 900 $QR_LIVENESS" \
  "$HERE/guest-net.sh" quic-client "$QR"
# The same two at standard Ethernet MTU: the tap and the guest's eth0 at 1500
# bytes, so rxe0 and the host's soft both run at RoCE MTU 1024 and every QUIC
# datagram above it crosses as two UD SENDs (docs/architecture.md §6).
TAP1500=("$HERE/run.sh" --netdev tap1500 --timeout 900)
step "tap MTU 1500 (RoCE MTU 1024, segmented): QUIC 16 MiB, qr connect --provider soft (host) -> qr serve --provider verbs (guest rxe)" \
  "${TAP1500[@]}" \
  --host "$QR connect --provider soft --ip 10.77.0.1 --cert \$RXE_XFER/cert.der --bytes 16M --pings 200 --wait 300 --timeout 600 --json $QR_LIVENESS 10.77.0.2:18515 >\$RXE_XFER/connect.json && python3 $HERE/check-segmented.py \$RXE_XFER/connect.json" \
  "$HERE/guest-net.sh" quic-server "$QR"
step "tap MTU 1500 (RoCE MTU 1024, segmented): QUIC 16 MiB, qr connect --provider verbs (guest rxe) -> qr serve --provider soft (host)" \
  "${TAP1500[@]}" --env QUIC_BYTES=16M --env QUIC_EXPECT_MTU=1024 \
  --host "$QR serve --provider soft --ip 10.77.0.1 --cert-out \$RXE_XFER/cert.der --once --timeout 900 $QR_LIVENESS" \
  "$HERE/guest-net.sh" quic-client "$QR"
step "tap: image blob 64 MiB, qr node-agent --provider verbs (guest rxe) <- qr registry-agent --provider soft (host), sha256 equal" \
  "${TAP[@]}" \
  --host "$HERE/host-image.sh $QR 64" \
  "$HERE/guest-net.sh" image-node "$QR"
# The gateway's client: aioquic, an independent QUIC stack (PyPI; .ci/run puts it
# in its venv as QR_AIOQUIC_PYTHON, else it is installed here).
AIOQUIC_PY="${QR_AIOQUIC_PYTHON:-}"
if [[ -z "$AIOQUIC_PY" ]]; then
  venv="${TMPDIR:-/tmp}/qr-aioquic-venv"
  "$venv/bin/python" -c 'import aioquic' 2>/dev/null ||
    { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet aioquic==1.7.2; }
  AIOQUIC_PY="$venv/bin/python"
fi
step "tap: qr gateway to-fabric --provider verbs (guest rxe): aioquic on the host, UDP -> gateway -> qr serve --provider verbs, 16 MiB sha256 equal" \
  "${TAP[@]}" \
  --host "$HERE/host-gateway.sh $AIOQUIC_PY 16777216" \
  "$HERE/guest-net.sh" gateway "$QR"
log "total $(( $(date +%s) - t0 )) s"
echo "verbs: $pass passed, $fail failed"
[[ $fail == 0 ]]
