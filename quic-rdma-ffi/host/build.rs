//! Compiles the C side (c/latency_client.c over examples/qr_latency.h) into a
//! static library linked ahead of quic-rdma-ffi, whose `qr_*` symbols it calls.

fn main() {
    for f in [
        "c/latency_client.c",
        "../examples/qr_latency.h",
        "../include/quic_rdma.h",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    cc::Build::new()
        .file("c/latency_client.c")
        .include("../include")
        .include("../examples")
        .flag("-std=c11")
        .define("_POSIX_C_SOURCE", "200809L")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("qr_host_c");
}
