#!/bin/sh
# Build the container image of `qr` without a daemon (umoci), reproducibly:
# the same binary gives the same image digest, whenever and wherever it is
# built (every timestamp is SOURCE_DATE_EPOCH, default 0; no build host
# names; one layer).
#
#   deploy/image/build.sh QR_BINARY LAYOUT_DIR [TAG]
#
# The image: the release binary as its entrypoint, the shared libraries it
# links (ldd), the CA certificates (for an https:// --upstream), and a
# non-root user (qr, 65532). Push it with skopeo:
#   skopeo copy oci:LAYOUT_DIR:TAG docker://REGISTRY/quic-rdma/qr:TAG
set -eu

qr=${1:?usage: build.sh QR_BINARY LAYOUT_DIR [TAG]}
out=${2:?usage: build.sh QR_BINARY LAYOUT_DIR [TAG]}
tag=${3:-latest}
epoch=${SOURCE_DATE_EPOCH:-0}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

for tool in umoci ldd; do
    command -v "$tool" >/dev/null || { echo "build.sh: $tool is needed (apt-get install umoci libc-bin)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp"
cp "$qr" "$root/usr/local/bin/qr"
chmod 0755 "$root/usr/local/bin/qr"
# The dynamic loader and every library the binary links.
for lib in $(ldd "$qr" | awk '/=> \// { print $3 } /^\t\/.*ld-linux/ { print $1 }'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
fi
printf 'root:x:0:0:root:/:/sbin/nologin\nqr:x:65532:65532:qr:/:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nqr:x:65532:\n' >"$root/etc/group"
chmod 1777 "$root/tmp"
# Reproducible: fixed times and modes, no owner but root.
find "$root" -exec touch -h -d "@$epoch" {} +

[ -f "$out/oci-layout" ] || umoci init --layout "$out"
umoci new --image "$out:$tag"
umoci insert --rootless --image "$out:$tag" --history.created "$created" \
    --history.created_by "deploy/image/build.sh" "$root" /
umoci config --image "$out:$tag" --created "$created" --author quic-rdma \
    --history.created "$created" --history.created_by "deploy/image/build.sh" \
    --config.entrypoint /usr/local/bin/qr --config.user 65532:65532 \
    --config.workingdir / --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
umoci gc --layout "$out"
