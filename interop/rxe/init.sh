#!/bin/busybox sh
# /init of the rxe guest (built into the initramfs by run.sh).
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "[guest] $*"; poweroff -f; }
for m in $(cat /modules.order); do
  insmod /lib/modules/$m 2>/dev/null || echo "[guest] insmod $m failed"
done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /newroot || fail "mount hostroot failed"
R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
# The guest's /tmp is writable and its own, yet shows the host's /tmp beneath it
# (an overlay: host /tmp read-only below, a tmpfs above), so a checkout, target
# dir or binary under the host's /tmp runs at the same path in the guest.
mount -t tmpfs -o size=1g tmpfs /ovl || fail "tmpfs for /tmp failed"
mkdir -p /ovl/upper /ovl/work
mount -t overlay -o lowerdir=$R/tmp,upperdir=/ovl/upper,workdir=/ovl/work overlay $R/tmp ||
  fail "overlay of the host's /tmp failed (is overlay.ko in the initramfs?)"
mount -t tmpfs tmpfs $R/run
mkdir -p $R/tmp/xfer
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 xfer $R/tmp/xfer || fail "mount xfer failed"
IP="chroot $R /usr/bin/ip"
[ -x $R/usr/bin/ip ] || IP="chroot $R /sbin/ip"
$IP link set lo up
NETDEV=$(cat $R/tmp/xfer/netdev)
case "$NETDEV" in
  lo) DEV=lo ;;
  dummy*) MTU=${NETDEV#dummy}; DEV=qrdummy0
    $IP link add $DEV type dummy && $IP link set $DEV mtu $MTU && $IP addr add 10.77.0.1/24 dev $DEV && $IP link set $DEV up || fail "dummy setup failed" ;;
  tap*) DEV=eth0; MTU=${NETDEV#tap}; MTU=${MTU:-9000}
    $IP link set $DEV mtu $MTU && $IP addr add 10.77.0.2/24 dev $DEV && $IP link set $DEV up || fail "eth0 setup failed" ;;
  *) fail "unknown netdev $NETDEV" ;;
esac
chroot $R /usr/bin/rdma link add rxe0 type rxe netdev $DEV || fail "rdma link add failed"
chroot $R /bin/sh /tmp/xfer/cmd.sh
echo $? > $R/tmp/xfer/rc
sync
poweroff -f
