#!/bin/sh
# Guest half of the host <-> guest tests over the tap link (run.sh --netdev tap):
# the guest is 10.77.0.2 (rxe0 on eth0), the host 10.77.0.1 (`soft` in run.sh's
# namespace). run-tests.sh pairs each mode with its host half (run.sh --host).
# Usage: guest-net.sh MODE [QR]
#   pp-server    rdma-core's ibv_ud_pingpong as the server (host: qr ud-pingpong client)
#   pp-client    ibv_ud_pingpong as the client of the host's qr ud-pingpong server
#   quic-server  QR serve --provider verbs (host: qr connect --provider soft)
#   quic-client  QR connect --provider verbs to the host's qr serve --provider soft
#                (with QUIC_EXPECT_MTU: rxe0 must run at it, and the transfer must
#                have been segmented, check-segmented.py)
#   image-node   QR node-agent --provider verbs pulls a blob from the host's
#                qr registry-agent --provider soft (host-image.sh) over HTTP; the
#                blob's sha256 must equal its digest
#   gateway      QR serve --provider verbs and QR gateway to-fabric --provider verbs
#                on rxe0; the host's aioquic client (host-gateway.sh) sends through
#                the gateway's UDP port; serve must report the client's sha256
# Environment: PP_SIZE, PP_ITERS (ping-pong), QUIC_BYTES (transfer size).
MODE="$1"; QR="$2"
PP_SIZE="${PP_SIZE:-1024}"; PP_ITERS="${PP_ITERS:-500}"; QUIC_BYTES="${QUIC_BYTES:-16M}"
GID_WANT=0000:0000:0000:0000:0000:ffff:0a4d:0002   # ::ffff:10.77.0.2
gid_index() { # index of the RoCE v2 GID ::ffff:10.77.0.2 on rxe0 port 1 (waits for it)
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
      i=${f##*/}
      [ "$(cat $f)" = "$GID_WANT" ] || continue
      [ "$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && { echo $i; return 0; }
    done
    sleep 1
  done
  return 1
}
g=$(gid_index) || { echo "[guest] no RoCE v2 GID for 10.77.0.2 on rxe0"; exit 1; }
echo "[guest] rxe0 on eth0: RoCE v2 GID ::ffff:10.77.0.2 at index $g, active_mtu $(ibv_devinfo -d rxe0 | awk '/active_mtu/{print $2}')"
# The guest runs under TCG emulation and can stall for seconds (a CI machine
# with 2 cores also runs the host side): the fabric defaults (1.5 s idle
# timeout) would call such a stall a dead peer. Both ends widen the timers.
QR_LIVENESS="--idle-timeout 30s --keep-alive 1s"

image_node() { # the node agent on rxe0, its pull API on the guest's loopback
  for _ in $(seq 1 600); do [ -f /tmp/xfer/ready ] && break; sleep 1; done
  [ -f /tmp/xfer/ready ] || { echo "[guest] the host's registry agent never got ready"; return 1; }
  want=$(cat /tmp/xfer/blob.digest)
  P=/tmp/xfer/pki
  "$QR" node-agent --provider verbs --ip 10.77.0.2 --registry 10.77.0.1:19651 \
    --listen 127.0.0.1:19653 --cache-dir /tmp/node-cache --stall-timeout 300 \
    --cert $P/node.pem --key $P/node-key.pem --ca $P/ca.pem $QR_LIVENESS >/tmp/na.out 2>/tmp/na.log &
  na=$!
  for _ in $(seq 1 600); do grep -q ready /tmp/na.out 2>/dev/null && break; kill -0 $na || break; sleep 0.5; done
  grep -q ready /tmp/na.out || { echo "[guest] node agent did not start:"; cat /tmp/na.log; return 1; }
  t0=$(date +%s)
  curl -fsS --max-time 900 -o /tmp/blob "http://127.0.0.1:19653/v2/qr/rxe/blobs/$want"; crc=$?
  t1=$(date +%s)
  curl -fsS http://127.0.0.1:19653/metrics | grep -E '^qr_node_(bytes|objects)_total' | sed 's/^/[guest] /'
  kill $na 2>/dev/null; wait $na 2>/dev/null
  [ $crc = 0 ] || { echo "[guest] GET of the blob failed (curl $crc):"; tail -20 /tmp/na.log; return 1; }
  got="sha256:$(sha256sum /tmp/blob | cut -d' ' -f1)"
  echo "[guest] $(stat -c %s /tmp/blob) bytes in $((t1 - t0)) s over verbs, sha256 $got (want $want)"
  [ "$got" = "$want" ] && [ "$(stat -c %s /tmp/blob)" -ge $((64 << 20)) ]
}

gateway() { # qr serve and qr gateway to-fabric, both on rxe0; the client is the host's
  "$QR" serve --provider verbs --ip 10.77.0.2 --cert-out /tmp/xfer/cert.der \
    --udp-gateway 10.77.0.2 $QR_LIVENESS >/tmp/serve.out 2>/tmp/serve.log &
  sv=$!
  for _ in $(seq 1 600); do [ -s /tmp/xfer/cert.der ] && break; kill -0 $sv || break; sleep 0.5; done
  [ -s /tmp/xfer/cert.der ] || { echo "[guest] qr serve did not start:"; cat /tmp/serve.log; return 1; }
  "$QR" gateway to-fabric --provider verbs --listen 10.77.0.2:4433 --fabric-ip 10.77.0.2 \
    --target 10.77.0.2:18515 --metrics 127.0.0.1:19654 >/tmp/gw.out 2>/tmp/gw.log &
  gw=$!
  for _ in $(seq 1 600); do curl -fsS -o /dev/null http://127.0.0.1:19654/metrics 2>/dev/null && break; kill -0 $gw || break; sleep 0.5; done
  curl -fsS -o /dev/null http://127.0.0.1:19654/metrics || { echo "[guest] the gateway did not start:"; cat /tmp/gw.log; kill $sv; return 1; }
  sed 's/^/[guest] /' /tmp/gw.log
  : >/tmp/xfer/gw-ready
  for _ in $(seq 1 900); do [ -s /tmp/xfer/done ] && break; sleep 1; done
  curl -fsS http://127.0.0.1:19654/metrics | grep -E '^qr_gateway_(udp|fabric)_(rx|tx)_datagrams_total|^qr_gateway_drop_udp_too_big' | sed 's/^/[guest] /'
  kill $gw $sv 2>/dev/null; wait $gw $sv 2>/dev/null
  sed 's/^/[guest] /' /tmp/serve.out
  want=$(sed -n 's/.*"sha256_sent": "\([0-9a-f]*\)".*/\1/p' /tmp/xfer/client.json)
  [ "$(cat /tmp/xfer/done)" = 0 ] && [ -n "$want" ] && grep -q "received [0-9]* bytes, sha256 $want" /tmp/serve.out
}

case "$MODE" in
  pp-server) exec ibv_ud_pingpong -d rxe0 -g "$g" -s "$PP_SIZE" -n "$PP_ITERS" ;;
  pp-client) exec ibv_ud_pingpong -d rxe0 -g "$g" -s "$PP_SIZE" -n "$PP_ITERS" 10.77.0.1 ;;
  quic-server) exec "$QR" serve --provider verbs --ip 10.77.0.2 --cert-out /tmp/xfer/cert.der --once --timeout 900 $QR_LIVENESS ;;
  quic-client)
    if [ -z "${QUIC_EXPECT_MTU:-}" ]; then
      exec "$QR" connect --provider verbs --cert /tmp/xfer/cert.der --bytes "$QUIC_BYTES" --pings 200 --wait 60 --timeout 900 $QR_LIVENESS 10.77.0.1:18515
    fi
    # At a small RoCE MTU: rxe0 must run at it, and the report must show
    # datagrams cut into parts and reassembled (check-segmented.py).
    mtu=$(ibv_devinfo -d rxe0 | awk '/active_mtu/{print $2}')
    [ "$mtu" = "$QUIC_EXPECT_MTU" ] || { echo "[guest] rxe0 active_mtu $mtu, want $QUIC_EXPECT_MTU"; exit 1; }
    "$QR" connect --provider verbs --cert /tmp/xfer/cert.der --bytes "$QUIC_BYTES" --pings 200 --wait 60 --timeout 900 --json $QR_LIVENESS 10.77.0.1:18515 >/tmp/connect.json
    rc=$?
    [ $rc = 0 ] || { echo "[guest] qr connect exit $rc"; cat /tmp/connect.json; exit $rc; }
    exec python3 "$(dirname "$0")/check-segmented.py" /tmp/connect.json ;;
  image-node) image_node; rc=$?; echo $rc >/tmp/xfer/done; exit $rc ;;
  gateway) gateway; exit $? ;;
  *) echo "guest-net.sh: unknown mode $MODE"; exit 2 ;;
esac
