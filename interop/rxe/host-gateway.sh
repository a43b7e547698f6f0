#!/usr/bin/env bash
# Host half of the rxe guest's gateway step (run-tests.sh, via run.sh --netdev tap
# --host): an independent QUIC client (aioquic, plain UDP) on the host reaches
# `qr serve --provider verbs` in the guest through `qr gateway to-fabric
# --provider verbs` (guest-net.sh gateway): UDP over the tap, then UD SENDs on the
# guest's rxe0. Both halves share $RXE_XFER (/tmp/xfer in the guest): cert.der
# and gw-ready (written by the guest), client.json and done (written here).
# Exits 0 only if the client's verdict matched: the server's sha256 of what
# arrived equals the client's of what it sent.
# Usage: host-gateway.sh AIOQUIC_PYTHON [BYTES]
set -euo pipefail
PY="$1"; BYTES="${2:-16777216}"
X="$RXE_XFER"
CLIENT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tools/tests/gateway_support/aioquic_client.py"
for _ in $(seq 1 900); do [[ -e "$X/gw-ready" ]] && break; sleep 1; done
[[ -e "$X/gw-ready" ]] || { echo "the guest's gateway never got ready"; echo 1 >"$X/done"; exit 1; }
rc=0
timeout 600 "$PY" "$CLIENT" 10.77.0.2 4433 "$X/cert.der" "$BYTES" 1 >"$X/client.json" || rc=$?
cat "$X/client.json"
echo "$rc" >"$X/done"
[[ $rc == 0 ]] && grep -q '"ok": true' "$X/client.json"
