#!/usr/bin/env bash
# The image channel's benchmark row (issue 11): one blob (1 GiB by default)
#   1. direct:  HTTP GET from docker-registry over TCP loopback (curl)
#   2. raw:     `qr demo --provider soft` moving the same byte count over one QUIC stream
#   3. agents:  HTTP GET from `qr node-agent` <- soft fabric <- `qr registry-agent`
#               cold (the registry agent pulls through from docker-registry at the
#               same time) and warm (the registry agent has it cached; fresh node cache)
# in one run, each sha256-checked. Needs docker-registry, curl, and `qr` built
# (cargo build --release -p quic-rdma-tools). Usage: benches/image.sh [SIZE_MIB]
# (NODE_OPTS="--parallel 4 --chunk-size 4M ..." passes options to the node agent).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MIB=${1:-1024}
QR=${QR:-${CARGO_TARGET_DIR:-target}/release/qr}
[[ -x $QR ]] || { echo "build qr first: cargo build --release -p quic-rdma-tools" >&2; exit 2; }
T=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT
REG=127.0.111.90:19190

cat > "$T/registry.yml" <<YML
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $T/storage}, redirect: {disable: true}}
http: {addr: $REG}
YML
docker-registry serve "$T/registry.yml" > "$T/registry.out" 2> "$T/registry.log" & PIDS+=($!)
until curl -sf "http://$REG/v2/" > /dev/null; do sleep 0.1; done

head -c "$((MIB << 20))" /dev/urandom > "$T/blob"
DIGEST="sha256:$(sha256sum "$T/blob" | cut -d' ' -f1)"
LOC=$(curl -sf -X POST -D - "http://$REG/v2/bench/blob/blobs/uploads/" -o /dev/null | tr -d '\r' | sed -n 's/^[Ll]ocation: //p')
case $LOC in http*) ;; *) LOC="http://$REG$LOC" ;; esac
curl -sf -T "$T/blob" -H 'Content-Type: application/octet-stream' "$LOC&digest=$DIGEST" > /dev/null
rm "$T/blob"

mbit() { awk -v b="$((MIB << 20))" -v s="$1" 'BEGIN { printf "%.0f", b * 8 / s / 1e6 }'; }
check() { [[ "sha256:$(sha256sum "$1" | cut -d' ' -f1)" == "$DIGEST" ]] || { echo "sha256 mismatch in $2" >&2; exit 1; }; rm -f "$1"; }

# 1. direct
read -r _ total < <(curl -sf -o "$T/out" -w '%{time_starttransfer} %{time_total}\n' "http://$REG/v2/bench/blob/blobs/$DIGEST")
check "$T/out" direct
DIRECT=$total

# 2. raw QUIC over soft, same byte count
RAW_JSON=$("$QR" demo --provider soft --server-ip 127.0.111.91 --client-ip 127.0.111.92 --service-port 19191 \
    --bytes "${MIB}M" --pings 0 --json)
grep -q '"sha256_match": true' <<< "$RAW_JSON" || { echo "raw transfer: sha256 mismatch" >&2; exit 1; }
RAW_GBIT=$(grep -o '"gbit_per_s": [0-9.]*' <<< "$RAW_JSON" | head -1 | awk '{print $2}')

# 3. the agents
"$QR" cert --dir "$T/pki" --leaf registry=127.0.111.93 --leaf node=node > /dev/null
TLS=(--ca "$T/pki/ca.pem")
"$QR" registry-agent --upstream "http://$REG" --ip 127.0.111.93 --service-port 19193 --cache-dir "$T/rc" \
    --cert "$T/pki/registry.pem" --key "$T/pki/registry-key.pem" "${TLS[@]}" > "$T/ra.out" 2> "$T/ra.log" & PIDS+=($!)
node_agent() {
    "$QR" node-agent --registry 127.0.111.93:19193 --ip 127.0.111.94 --listen 127.0.111.94:19194 \
        --cache-dir "$T/$1" ${NODE_OPTS:-} --cert "$T/pki/node.pem" --key "$T/pki/node-key.pem" "${TLS[@]}" > "$T/$1.out" 2> "$T/$1.log" &
    NA=$!
    until curl -sf "http://127.0.111.94:19194/v2/" > /dev/null; do sleep 0.1; done
}
agents() {
    read -r first total < <(curl -sf -o "$T/out" -w '%{time_starttransfer} %{time_total}\n' \
        "http://127.0.111.94:19194/v2/bench/blob/blobs/$DIGEST")
    check "$T/out" "agents $1"
    echo "$first $total"
}
node_agent nc1
read -r COLD_FIRST COLD_TOTAL < <(agents cold)
kill "$NA"; wait "$NA" 2>/dev/null || true
node_agent nc2; PIDS+=("$NA")
read -r WARM_FIRST WARM_TOTAL < <(agents warm)
CHUNK=$(curl -sf "http://127.0.111.94:19194/metrics" | awk '/^qr_node_chunk_size_bytes/ {print $2}')

printf '\n| row (%d MiB, sha256 checked) | seconds | Mbit/s |\n|---|---|---|\n' "$MIB"
printf '| direct HTTP GET from docker-registry (TCP loopback) | %.2f | %s |\n' "$DIRECT" "$(mbit "$DIRECT")"
printf '| raw QUIC over soft (`qr demo --provider soft`, one stream) | - | %.0f |\n' "$(awk -v g="$RAW_GBIT" 'BEGIN{print g*1000}')"
printf '| agents, cold (registry agent pulling through at the same time): fabric+verify+cache (first byte) | %.2f | %s |\n' "$COLD_FIRST" "$(mbit "$COLD_FIRST")"
printf '| agents, cold, whole HTTP answer | %.2f | %s |\n' "$COLD_TOTAL" "$(mbit "$COLD_TOTAL")"
printf '| agents, warm registry agent: fabric+verify+cache (first byte) | %.2f | %s |\n' "$WARM_FIRST" "$(mbit "$WARM_FIRST")"
printf '| agents, warm, whole HTTP answer | %.2f | %s |\n' "$WARM_TOTAL" "$(mbit "$WARM_TOTAL")"
echo "adaptive chunk size at the end: $CHUNK bytes; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
