#!/usr/bin/env bash
# Install the quic-rdma C API into PREFIX (default /usr/local) from a release
# build (`cargo build --release -p quic-rdma-ffi` first):
#
#     quic-rdma-ffi/install.sh [--keep-debug] [PREFIX]
#
# PREFIX/include: quic_rdma.h, quic_rdma.hpp
# PREFIX/lib:     libquic_rdma_ffi.so.X.Y.Z (SONAME libquic_rdma_ffi.so.X),
#                 symlinks libquic_rdma_ffi.so.X and libquic_rdma_ffi.so,
#                 libquic_rdma_ffi.a (debug info stripped unless --keep-debug:
#                 ~37 MB -> ~25 MB, most of it the Rust standard library's)
# PREFIX/lib/pkgconfig: quic_rdma.pc (shared), quic_rdma_static.pc (static)
#
# CARGO_TARGET_DIR is honoured. Prints what it installed and the sizes.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
strip_debug=true
if [[ ${1:-} == --keep-debug ]]; then
    strip_debug=false
    shift
fi
prefix=${1:-/usr/local}
target=${CARGO_TARGET_DIR:-$here/../target}/release
version=$(sed -n 's/^Version: //p' "$here/quic_rdma.pc")
major=${version%%.*}
libdir=$prefix/lib
includedir=$prefix/include
pcdir=$libdir/pkgconfig

for f in libquic_rdma_ffi.so libquic_rdma_ffi.a; do
    [[ -f $target/$f ]] || {
        echo "$target/$f missing: cargo build --release -p quic-rdma-ffi first" >&2
        exit 1
    }
done

install -d "$libdir" "$includedir" "$pcdir"
install -m 644 "$here/include/quic_rdma.h" "$here/include/quic_rdma.hpp" "$includedir/"
install -m 755 "$target/libquic_rdma_ffi.so" "$libdir/libquic_rdma_ffi.so.$version"
ln -sfn "libquic_rdma_ffi.so.$version" "$libdir/libquic_rdma_ffi.so.$major"
ln -sfn "libquic_rdma_ffi.so.$major" "$libdir/libquic_rdma_ffi.so"
install -m 644 "$target/libquic_rdma_ffi.a" "$libdir/libquic_rdma_ffi.a"
if $strip_debug; then
    # Symbols stay (the archive must still link); only DWARF goes.
    strip --strip-debug "$libdir/libquic_rdma_ffi.a"
fi
for pc in quic_rdma.pc quic_rdma_static.pc; do
    sed "s|^prefix=.*|prefix=$prefix|" "$here/$pc" >"$pcdir/$pc"
done

size() { stat -L -c %s "$1"; }
echo "installed quic-rdma C API $version into $prefix"
echo "  libquic_rdma_ffi.a: $(size "$libdir/libquic_rdma_ffi.a") bytes (build tree: $(size "$target/libquic_rdma_ffi.a"))"
echo "  libquic_rdma_ffi.so.$version: $(size "$libdir/libquic_rdma_ffi.so.$version") bytes, SONAME libquic_rdma_ffi.so.$major"
