#!/bin/sh
# Runs inside the rxe guest (via run.sh): rdma-core's own tools over rxe0, then the
# verbs provider's test binaries given as arguments. Prints one line per check and
# "N passed, M failed"; exits non-zero if anything failed.
# Usage: guest-suite.sh RAW_TEST_BIN QUIC_TEST_BIN PINGPONG_TEST_BIN [QR_VERBS_BIN [C_LATENCY_BIN]]
RAW="$1"; QUIC="$2"; PP="$3"; QR="$4"; LAT="$5"
pass=0; fail=0
check() { # name, command...
  name="$1"; shift
  echo "=== $name"
  t0=$(date +%s)
  if "$@"; then pass=$((pass+1)); echo "--- PASS $name ($(( $(date +%s) - t0 )) s)"
  else fail=$((fail+1)); echo "--- FAIL $name ($(( $(date +%s) - t0 )) s)"; fi
}
gid_index() { # index of the RoCE v2 GID ::ffff:127.0.0.1 on rxe0 port 1
  for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    i=${f##*/}
    [ "$(cat $f)" = "0000:0000:0000:0000:0000:ffff:7f00:0001" ] || continue
    [ "$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && { echo $i; return; }
  done
  return 1
}
wait_listen() { # port pid: wait (up to 60 s) until something listens on TCP port;
  # a fixed sleep raced with a slow start under TCG emulation on a loaded host.
  # /proc/net/tcp: local address "ADDR:PORT" (hex), state 0A = LISTEN.
  for _ in $(seq 1 600); do
    kill -0 "$2" 2>/dev/null || return 1
    awk '$4 == "0A" { print $2 }' /proc/net/tcp /proc/net/tcp6 2>/dev/null |
      grep -qi ":$(printf %04X "$1")\$" && return 0
    sleep 0.1
  done
  return 1
}
devinfo() {
  out=$(ibv_devinfo -d rxe0) || return 1
  echo "$out" | grep -E "hca_id|state|active_mtu"
  echo "$out" | grep -q "PORT_ACTIVE" && echo "$out" | grep -q "active_mtu:.*4096"
}
ud_pingpong() { # rdma-core's ibv_ud_pingpong, unmodified, both sides over rxe0
  g=$(gid_index) || { echo "no RoCE v2 GID for 127.0.0.1"; return 1; }
  ibv_ud_pingpong -d rxe0 -g "$g" -n 200 -s 1024 >/tmp/srv.log 2>&1 &
  srv=$!
  wait_listen 18515 $srv || { kill $srv 2>/dev/null; cat /tmp/srv.log; return 1; }
  ibv_ud_pingpong -d rxe0 -g "$g" -n 200 -s 1024 127.0.0.1; crc=$?
  [ $crc = 0 ] || kill $srv 2>/dev/null
  wait $srv; src=$?
  sed 's/^/  server: /' /tmp/srv.log
  [ $crc = 0 ] && [ $src = 0 ]
}
qr_ud_pingpong() { # qr ud-pingpong --provider verbs in both roles against ibv_ud_pingpong
  g=$(gid_index) || { echo "no RoCE v2 GID for 127.0.0.1"; return 1; }
  "$QR" ud-pingpong --provider verbs -g "$g" -p 18601 -n 200 -s 4096 --timeout 60 >/tmp/qs.log 2>&1 &
  qs=$!
  wait_listen 18601 $qs || { kill $qs 2>/dev/null; cat /tmp/qs.log; return 1; }
  ibv_ud_pingpong -d rxe0 -g "$g" -p 18601 -n 200 -s 4096 127.0.0.1; c1=$?
  [ $c1 = 0 ] || kill $qs 2>/dev/null
  wait $qs; s1=$?
  sed 's/^/  qr server: /' /tmp/qs.log
  ibv_ud_pingpong -d rxe0 -g "$g" -p 18602 -n 200 -s 4096 >/tmp/is.log 2>&1 &
  is=$!
  wait_listen 18602 $is || { kill $is 2>/dev/null; cat /tmp/is.log; return 1; }
  "$QR" ud-pingpong --provider verbs -g "$g" -p 18602 -n 200 -s 4096 --timeout 60 127.0.0.1; c2=$?
  [ $c2 = 0 ] || kill $is 2>/dev/null
  wait $is; s2=$?
  sed 's/^/  ibv server: /' /tmp/is.log
  [ $c1 = 0 ] && [ $s1 = 0 ] && [ $c2 = 0 ] && [ $s2 = 0 ]
}
qr_devices() { # qr devices agrees with ibv_devinfo -v: every GID, its type, the MTU
  "$QR" devices >/tmp/qd.txt 2>&1 || { cat /tmp/qd.txt; return 1; }
  cat /tmp/qd.txt
  grep -q "^  rxe0 " /tmp/qd.txt || { echo "rxe0 not listed"; return 1; }
  grep -q "port 1  ACTIVE  Ethernet  active MTU 4096" /tmp/qd.txt || { echo "port 1 line differs"; return 1; }
  ibv_devinfo -v -d rxe0 | grep -E "GID\[ *[0-9]+\]:" >/tmp/gids.txt
  [ -s /tmp/gids.txt ] || { echo "ibv_devinfo -v listed no GID"; return 1; }
  n=0
  while read -r line; do
    idx=$(echo "$line" | sed -E 's/.*GID\[ *([0-9]+)\]:.*/\1/')
    gid=$(echo "$line" | sed -E 's/.*\]:[[:space:]]*([^,]+),.*/\1/')
    ty=$(echo "$line" | sed -E 's/.*, (RoCE v[12]).*/\1/')
    want="GID[$(printf %3d "$idx")]  $gid "
    grep -F "$want" /tmp/qd.txt | grep -q "$ty" || { echo "qr devices lacks: $want ($ty)"; return 1; }
    n=$((n+1))
  done </tmp/gids.txt
  echo "qr devices matches ibv_devinfo -v on $n GIDs"
  [ "$(grep -c "GID\[" /tmp/qd.txt)" = "$n" ]
}
c_latency_verbs() { # the C API over verbs: C server and C client, found by the address service
  "$LAT" --serve 127.0.0.1 /tmp/lat-cert.der --provider verbs --service 127.0.0.1:18620 \
    </dev/null >/tmp/lat-srv.log 2>&1 &
  ls=$!
  wait_listen 18620 $ls || { kill $ls 2>/dev/null; cat /tmp/lat-srv.log; return 1; }
  "$LAT" --connect-service 127.0.0.1 127.0.0.1:18620 /tmp/lat-cert.der 2000 --provider verbs \
    >/tmp/lat-cli.log 2>&1; c=$?
  [ $c = 0 ] || kill $ls 2>/dev/null
  wait $ls; s=$?
  cat /tmp/lat-cli.log; sed 's/^/  server: /' /tmp/lat-srv.log
  [ $c = 0 ] && [ $s = 0 ] && grep -q "provider=verbs .* iterations=2000" /tmp/lat-cli.log &&
    grep -q "served bytes=[1-9]" /tmp/lat-srv.log
}
check "ibv_devinfo: rxe0 active, MTU 4096" devinfo
[ -n "$QR" ] && check "qr devices lists rxe0 like ibv_devinfo -v (GIDs, types, MTU)" qr_devices
check "ibv_ud_pingpong client <-> server over rxe0" ud_pingpong
[ -n "$QR" ] && check "qr ud-pingpong --provider verbs <-> ibv_ud_pingpong (both roles, 4096 B)" qr_ud_pingpong
# The async-event test needs an Ethernet netdev (the kernel makes no GIDs from
# a loopback device's new addresses): run-tests.sh runs it on the dummy netdev.
check "verbs provider raw UD tests" env QR_REQUIRE_RDMA=1 QR_EXPECT_MTU=4096 "$RAW" --test-threads=1 --nocapture \
  --skip readiness_fd_turns_readable_on_an_async_event
check "verbs provider <-> rdma-core ibv_ud_pingpong (both roles)" env QR_REQUIRE_RDMA=1 "$PP" --test-threads=1 --nocapture
check "QUIC over verbs: handshake + 64 MiB, sha256 equal" env QR_REQUIRE_RDMA=1 "$QUIC" --nocapture
[ -n "$LAT" ] && check "C API over verbs: C latency server <-> client via the address service (2000 x 64 B)" c_latency_verbs
echo "guest suite: $pass passed, $fail failed"
[ $fail = 0 ]
