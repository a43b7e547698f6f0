#!/bin/sh
# Build the container image of `qr` without a daemon (umoci), reproducibly:
# the same binaries give the same image digests, whenever and wherever they
# are built (every timestamp is SOURCE_DATE_EPOCH, default 0; no build host
# names; one layer per platform; platforms sorted).
#
#   deploy/image/build.sh LAYOUT_DIR TAG linux/amd64=QR_BINARY [linux/arm64=QR_BINARY ...]
#   deploy/image/build.sh QR_BINARY LAYOUT_DIR [TAG]     (one platform, from the binary)
#
# One image per platform, tagged TAG-ARCH (e.g. latest-arm64): the release
# binary as its entrypoint, the shared libraries it links, the CA
# certificates (for an https:// --upstream), and a non-root user (qr, 65532).
# TAG names an OCI image index (multi-arch) of them, each with its platform:
# a client pulls the one of its own architecture. A binary of the build
# host's architecture gets its libraries from ldd; another one (cross-built)
# from its NEEDED entries (readelf), found in the cross sysroot
# /usr/TRIPLE/lib (Debian's libc6-dev-arm64-cross for arm64), and its loader
# at its PT_INTERP. Push every platform with skopeo:
#   skopeo copy --all oci:LAYOUT_DIR:TAG docker://REGISTRY/quic-rdma/qr:TAG
set -eu

usage='usage: build.sh LAYOUT_DIR TAG linux/ARCH=QR_BINARY... | build.sh QR_BINARY LAYOUT_DIR [TAG]'
die() { echo "build.sh: $*" >&2; exit 1; }
[ $# -ge 2 ] || die "$usage"

for tool in umoci readelf sha256sum; do
    command -v "$tool" >/dev/null || die "$tool is needed (apt-get install umoci binutils coreutils)"
done

# The ELF machine of a binary, as an OCI architecture.
elf_arch() {
    case $(readelf -h "$1" | sed -n 's/^ *Machine: *//p') in
        *X86-64*) echo amd64 ;;
        AArch64) echo arm64 ;;
        *) die "$1: an ELF machine this script does not know" ;;
    esac
}
# The Debian multiarch triple of an OCI architecture.
triple() {
    case $1 in
        amd64) echo x86_64-linux-gnu ;;
        arm64) echo aarch64-linux-gnu ;;
        *) die "architecture $1 is not supported (amd64, arm64)" ;;
    esac
}

case ${3:-}${4:-} in
    *=*)
        out=$1
        tag=$2
        shift 2
        ;;
    *)
        # The old form: one binary, the platform from its ELF header.
        qr=$1
        out=$2
        tag=${3:-latest}
        set -- "linux/$(elf_arch "$qr")=$qr"
        ;;
esac
epoch=${SOURCE_DATE_EPOCH:-0}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
host_arch=$(elf_arch /bin/sh)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Platforms sorted, one per architecture: the index does not depend on the
# order of the arguments.
for spec in "$@"; do
    case $spec in
        linux/*=?*) ;;
        *) die "$spec: expected linux/ARCH=QR_BINARY" ;;
    esac
    printf '%s\n' "$spec"
done | sort >"$work/platforms"
[ -s "$work/platforms" ] || die "$usage"
[ -z "$(cut -d= -f1 "$work/platforms" | uniq -d)" ] || die "a platform is given twice"

# index.json as one descriptor per line (umoci writes it on one line).
descriptors() {
    sed -e 's/^{"schemaVersion":2,"manifests":null}$//' \
        -e 's/^{"schemaVersion":2,"manifests":\[//' -e 's/\]}$//' \
        -e 's/},{"mediaType"/}\n{"mediaType"/g' "$out/index.json" | sed '/^$/d'
}
# ref_is [-v] NAME: the descriptor (not) tagged NAME.
ref_is() {
    if [ "$1" = -v ]; then
        grep -v -F "\"org.opencontainers.image.ref.name\":\"$2\"}"
    else
        grep -F "\"org.opencontainers.image.ref.name\":\"$1\"}"
    fi
}

[ -f "$out/oci-layout" ] || umoci init --layout "$out"
# An index under TAG from an earlier build goes first; it is written anew below.
descriptors | ref_is -v "$tag" >"$work/kept" || true
{
    printf '{"schemaVersion":2,"manifests":['
    paste -s -d, "$work/kept" | tr -d '\n'
    printf ']}'
} >"$work/index.json"
cp "$work/index.json" "$out/index.json"

# $1: a (NEEDED) library name of a foreign binary; copies it from the cross
# sysroot into the image, then whatever it needs in turn.
copy_foreign_lib() {
    case " $copied " in *" $1 "*) return 0 ;; esac
    copied="$copied $1"
    [ "$1" = "$(basename "$interp")" ] && return 0
    src=/usr/$tri/lib/$1
    [ -f "$src" ] || die "$1 ($arch) is not in /usr/$tri/lib (apt-get install libc6-dev-$arch-cross)"
    mkdir -p "$root/lib/$tri"
    cp -L "$src" "$root/lib/$tri/$1"
    for dep in $(readelf -d "$src" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        copy_foreign_lib "$dep"
    done
}

while IFS= read -r spec; do
    platform=${spec%%=*}
    qr=${spec#*=}
    os=${platform%%/*}
    arch=${platform#*/}
    tri=$(triple "$arch")
    [ -f "$qr" ] || die "$qr: no such binary"
    [ "$(elf_arch "$qr")" = "$arch" ] || die "$qr is not a $arch binary"

    root=$work/rootfs-$arch
    mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp"
    cp "$qr" "$root/usr/local/bin/qr"
    chmod 0755 "$root/usr/local/bin/qr"
    # The dynamic loader and every library the binary links.
    if [ "$arch" = "$host_arch" ]; then
        command -v ldd >/dev/null || die "ldd is needed (apt-get install libc-bin)"
        for lib in $(ldd "$qr" | awk '/=> \// { print $3 } /^\t\/.*ld-linux/ { print $1 }'); do
            mkdir -p "$root$(dirname "$lib")"
            cp -L "$lib" "$root$lib"
        done
    else
        interp=$(readelf -l "$qr" | sed -n 's/.*Requesting program interpreter: \(.*\)\]$/\1/p')
        [ -n "$interp" ] || die "$qr: no PT_INTERP"
        [ -f "/usr/$tri/lib/$(basename "$interp")" ] ||
            die "the $arch loader is not in /usr/$tri/lib (apt-get install libc6-dev-$arch-cross)"
        mkdir -p "$root$(dirname "$interp")"
        cp -L "/usr/$tri/lib/$(basename "$interp")" "$root$interp"
        copied=
        for dep in $(readelf -d "$qr" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            copy_foreign_lib "$dep"
        done
    fi
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
    fi
    printf 'root:x:0:0:root:/:/sbin/nologin\nqr:x:65532:65532:qr:/:/sbin/nologin\n' >"$root/etc/passwd"
    printf 'root:x:0:\nqr:x:65532:\n' >"$root/etc/group"
    chmod 1777 "$root/tmp"
    # Reproducible: fixed times and modes, no owner but root.
    find "$root" -exec touch -h -d "@$epoch" {} +

    image="$out:$tag-$arch"
    umoci new --image "$image"
    umoci insert --rootless --image "$image" --history.created "$created" \
        --history.created_by "deploy/image/build.sh" "$root" /
    umoci config --image "$image" --created "$created" --author quic-rdma \
        --os "$os" --architecture "$arch" \
        --history.created "$created" --history.created_by "deploy/image/build.sh" \
        --config.entrypoint /usr/local/bin/qr --config.user 65532:65532 \
        --config.workingdir / --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
done <"$work/platforms"
umoci gc --layout "$out"

# The image index: one manifest descriptor per platform, in the sorted order.
entries=
while IFS= read -r spec; do
    platform=${spec%%=*}
    os=${platform%%/*}
    arch=${platform#*/}
    desc=$(descriptors | ref_is "$tag-$arch")
    digest=$(printf '%s' "$desc" | sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p')
    size=$(printf '%s' "$desc" | sed -n 's/.*"size":\([0-9]*\).*/\1/p')
    [ -n "$digest" ] && [ -n "$size" ] || die "no manifest under $tag-$arch in $out/index.json"
    entries="$entries${entries:+,}{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"$digest\",\"size\":$size,\"platform\":{\"architecture\":\"$arch\",\"os\":\"$os\"}}"
done <"$work/platforms"
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s]}' \
    "$entries" >"$work/image-index"
sum=$(sha256sum "$work/image-index" | cut -d' ' -f1)
size=$(stat -c %s "$work/image-index")
cp "$work/image-index" "$out/blobs/sha256/$sum"
descriptors >"$work/kept"
printf '{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"}}\n' \
    "$sum" "$size" "$tag" >>"$work/kept"
{
    printf '{"schemaVersion":2,"manifests":['
    paste -s -d, "$work/kept" | tr -d '\n'
    printf ']}'
} >"$work/index.json"
cp "$work/index.json" "$out/index.json"
echo "$out:$tag sha256:$sum"
