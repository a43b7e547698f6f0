#!/usr/bin/env bash
# Run a host-built command inside a qemu guest that has kernel soft-RoCE (rdma_rxe).
#
#   interop/rxe/run.sh [options] [--] COMMAND [ARGS...]
#
# The guest boots Debian 12's kernel (linux-image-6.1.0-*-amd64) under qemu TCG from a
# small busybox initramfs, loads rdma_rxe and its dependencies, mounts the host's `/`
# read-only over virtio-9p and chroots into it, so host binaries and the host's rdma-core
# userspace (libibverbs, providers, ibverbs-utils, iproute2's `rdma`) run unchanged.
# The guest's /tmp is an overlay: the host's /tmp (read-only) beneath a guest tmpfs that
# takes the guest's writes, so every host path, /tmp/... included, means the same file
# in the guest (a checkout or target dir under /tmp works).
# Then `rdma link add rxe0 type rxe netdev lo` (active MTU 4096), `cd $PWD`, and COMMAND.
# COMMAND's output appears on stdout; the script exits with COMMAND's exit code
# (124 on timeout, 125 if the guest failed before running it).
#
# --netdev tap links the guest to the host: run.sh creates a network namespace of its
# own (qrxe-<pid>), a tap device in it (MTU 9000, 10.77.0.1/24) and runs qemu inside
# it with a virtio-net NIC on that tap; the guest's eth0 is 10.77.0.2/24, MTU 9000,
# and rxe0 sits on it (active MTU 4096). `--netdev tap1500` makes both ends 1500
# bytes, standard Ethernet: rxe0 then runs at RoCE MTU 1024, and so does `soft`
# on the host's tap. All traffic stays inside that namespace, which is deleted on
# exit (with the tap).
#
# Options:
#   --netdev NAME     netdev for rxe0: lo (default), or dummy1500 / dummy9000 for a dummy
#                     interface with that MTU and an address in 10.77.0.0/24 (guest-local
#                     only, no link leaves the guest), or `tap` / `tap1500`: a link to the
#                     host (below)
#   --host CMD        with --netdev tap: run CMD (bash) on the host inside the namespace,
#                     concurrently with the guest; its output is prefixed "[host] ". The
#                     run fails if either side fails. CMD sees RXE_XFER, a directory the
#                     guest sees as /tmp/xfer (for certificates and the like)
#   --timeout SECS    guest wall-clock limit (default 900)
#   --mem MiB         guest memory (default 2048)
#   --env NAME=VALUE  environment for COMMAND (repeatable); RUST_LOG/RUST_BACKTRACE pass through
#   --keep            keep the per-run directory
#
# Packages come from Debian (apt-get); downloaded .debs are cached in interop/rxe/cache/.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${RXE_CACHE:-$HERE/cache}"
NETDEV=lo
TIMEOUT=900
MEM=2048
KEEP=0
ENVS=()
HOSTCMD=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --netdev) NETDEV="$2"; shift 2 ;;
    --timeout) TIMEOUT="$2"; shift 2 ;;
    --mem) MEM="$2"; shift 2 ;;
    --env) ENVS+=("$2"); shift 2 ;;
    --host) HOSTCMD="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --) shift; break ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || { sed -n '2,36p' "$0" >&2; exit 2; }
[[ -z "$HOSTCMD" || "$NETDEV" == tap* ]] || { echo "run.sh: --host needs --netdev tap" >&2; exit 2; }

log() { echo "[rxe] $*" >&2; }

# ---- host packages ---------------------------------------------------------------
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
command -v depmod >/dev/null || need_pkgs+=(kmod)
command -v cpio >/dev/null || need_pkgs+=(cpio)
dpkg -s busybox-static >/dev/null 2>&1 || need_pkgs+=(busybox-static)
command -v ibv_devinfo >/dev/null || need_pkgs+=(ibverbs-utils)
command -v rdma >/dev/null || need_pkgs+=(iproute2)
[[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ]] || ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-* >/dev/null 2>&1 || need_pkgs+=(ibverbs-providers)
dpkg -s rdma-core >/dev/null 2>&1 || need_pkgs+=(rdma-core)
if ((${#need_pkgs[@]})); then
  log "installing ${need_pkgs[*]}"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}") >&2
fi

# ---- kernel + initramfs (cached) ------------------------------------------------------
mkdir -p "$CACHE"
KPKG="$(cd "$CACHE" && ls linux-image-6.1.0-*-amd64_*.deb 2>/dev/null | sort -V | tail -1 || true)"
if [[ -z "$KPKG" ]]; then
  [[ -n "$(apt-cache policy linux-image-amd64 2>/dev/null | grep Candidate)" ]] || apt-get update -qq >&2
  KNAME="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-6/{print $2; exit}')"
  log "downloading $KNAME"
  (cd "$CACHE" && apt-get download -qq "$KNAME" 2>&1 | grep -v 'unsandboxed' >&2 || true)
  KPKG="$(cd "$CACHE" && ls linux-image-6.1.0-*-amd64_*.deb | sort -V | tail -1)"
fi
KVER="$(echo "$KPKG" | sed -E 's/^linux-image-(6\.1\.0-[0-9]+-amd64)_.*/\1/')"
KDIR="$CACHE/kernel-$KVER"
if [[ ! -f "$KDIR/.done" ]]; then
  log "extracting $KPKG"
  rm -rf "$KDIR"; mkdir -p "$KDIR"
  dpkg-deb -x "$CACHE/$KPKG" "$KDIR"
  depmod -b "$KDIR" "$KVER"
  touch "$KDIR/.done"
fi
VMLINUZ="$KDIR/boot/vmlinuz-$KVER"

MODS=(virtio_pci virtio_net 9pnet_virtio 9p crc32_generic crc32-pclmul rdma_rxe dummy overlay)
INITRD="$CACHE/initrd-$KVER.cpio.gz"
if [[ ! -f "$INITRD" || "$INITRD" -ot "$HERE/init.sh" || "$INITRD" -ot "$0" ]]; then
  log "building initramfs for $KVER"
  IR="$(mktemp -d)"
  mkdir -p "$IR"/{bin,dev,proc,sys,newroot,ovl,lib/modules}
  cp /bin/busybox "$IR/bin/busybox"
  for a in sh mount umount insmod mkdir poweroff sleep cat echo ip chroot ls; do ln -s busybox "$IR/bin/$a"; done
  : >"$IR/modules.order"
  for m in "${MODS[@]}"; do
    modprobe -d "$KDIR" -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do
    base="$(basename "$ko")"
    case "$base" in
      *.xz) xz -dc "$ko" >"$IR/lib/modules/${base%.xz}"; base="${base%.xz}" ;;
      *.zst) zstd -qdc "$ko" >"$IR/lib/modules/${base%.zst}"; base="${base%.zst}" ;;
      *) cp "$ko" "$IR/lib/modules/$base" ;;
    esac
    echo "$base" >>"$IR/modules.order"
  done
  cp "$HERE/init.sh" "$IR/init"; chmod +x "$IR/init"
  (cd "$IR" && find . | cpio -o -H newc --quiet | gzip -1) >"$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
  rm -rf "$IR"
fi

# ---- the run ---------------------------------------------------------------------
RUN="$(mktemp -d /tmp/rxe-run.XXXXXX)"
NS=; HOSTPID=
cleanup() {
  if [[ -n "$HOSTPID" ]] && kill -0 "$HOSTPID" 2>/dev/null; then
    kill -- "-$HOSTPID" 2>/dev/null || kill "$HOSTPID" 2>/dev/null || true
  fi
  [[ -n "$NS" ]] && ip netns del "$NS" 2>/dev/null
  if [[ $KEEP == 1 ]]; then log "run dir kept: $RUN"; else rm -rf "$RUN"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
NETARGS=(-nic none)
INNS=()
if [[ "$NETDEV" == tap* ]]; then
  TAPMTU=${NETDEV#tap}; TAPMTU=${TAPMTU:-9000}
  [[ "$TAPMTU" =~ ^[0-9]+$ ]] || { echo "run.sh: --netdev tap or tapMTU (e.g. tap1500)" >&2; exit 2; }
  NS="qrxe-$$"
  TAP=qrtap0
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip -n "$NS" tuntap add dev "$TAP" mode tap
  ip -n "$NS" link set "$TAP" mtu "$TAPMTU"
  ip -n "$NS" addr add 10.77.0.1/24 dev "$TAP"
  ip -n "$NS" link set "$TAP" up
  NETARGS=(-netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no"
           -device "virtio-net-pci,netdev=n0,mac=52:54:00:77:00:02,host_mtu=$TAPMTU,romfile=")
  INNS=(ip netns exec "$NS")
  log "namespace $NS: $TAP 10.77.0.1/24 mtu $TAPMTU <-> guest eth0 10.77.0.2/24"
fi
{
  echo "#!/bin/sh"
  echo "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp"
  for v in RUST_LOG RUST_BACKTRACE; do
    [[ -n "${!v:-}" ]] && printf 'export %s=%q\n' "$v" "${!v}"
  done
  for e in "${ENVS[@]}"; do printf 'export %q\n' "$e"; done
  printf 'cd %q || exit 125\n' "$PWD"
  printf 'exec'; printf ' %q' "$@"; echo
} >"$RUN/cmd.sh"
echo "$NETDEV" >"$RUN/netdev"

if [[ -n "$HOSTCMD" ]]; then
  # Its own process group (set -m), so cleanup can end all of it.
  set -m
  "${INNS[@]}" env RXE_XFER="$RUN" bash -c "$HOSTCMD" > >(sed -u 's/^/[host] /') 2>&1 &
  HOSTPID=$!
  set +m
fi

log "booting guest ($KVER, TCG, netdev $NETDEV)"
start=$(date +%s)
set +e
timeout --foreground -k 5 "$TIMEOUT" "${INNS[@]}" qemu-system-x86_64 \
  -accel tcg,thread=multi -cpu max -smp 2 -m "$MEM" \
  -nographic -no-reboot -monitor none -serial stdio "${NETARGS[@]}" \
  -kernel "$VMLINUZ" -initrd "$INITRD" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$RUN",mount_tag=xfer,security_model=none \
  </dev/null | tr -d '\r'
qrc=${PIPESTATUS[0]}
set -e
log "guest ran $(( $(date +%s) - start )) s"
hrc=0
if [[ -n "$HOSTPID" ]]; then
  # The host side gets a grace period to finish after the guest is done.
  for _ in $(seq 1 300); do kill -0 "$HOSTPID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$HOSTPID" 2>/dev/null; then
    log "host command still running 30 s after the guest ended: killing it"
    kill -- "-$HOSTPID" 2>/dev/null || kill "$HOSTPID" 2>/dev/null || true
  fi
  wait "$HOSTPID" || hrc=$?
  HOSTPID=
  log "host command exit $hrc"
fi
if [[ $qrc == 124 ]]; then log "timeout after $TIMEOUT s"; exit 124; fi
if [[ -f "$RUN/rc" ]]; then
  rc="$(cat "$RUN/rc")"
  [[ $rc == 0 ]] || exit "$rc"
  exit "$hrc"
fi
log "guest did not run the command (qemu exit $qrc)"
exit 125
