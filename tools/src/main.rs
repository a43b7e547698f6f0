//! `qr`: the quic-rdma command line (see the library's docs).

fn main() -> std::process::ExitCode {
    quic_rdma_tools::run()
}
