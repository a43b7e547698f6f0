//! The C latency client (`c/latency_client.c` over `examples/qr_latency.h`).

use std::ffi::{c_char, c_int, c_long, c_void, CString};

use quic_rdma::fabric::UdAddr;
use quic_rdma_ffi::{qr_addr, qr_fabric};
use sha2::{Digest, Sha256};

/// Request and response size of the measurement, bytes.
pub const MSG: usize = 64;

/// Round-trip times of one run, microseconds (`qr_latency_result`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencyResult {
    /// Measured request/responses (after the warm-up).
    pub iterations: c_long,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest.
    pub max_us: f64,
}

extern "C" {
    /// `fabric` is a `const qr_fabric *`: opaque to C, so declared as `void`.
    fn qr_host_latency_client(
        fabric: *const c_void,
        gid: *const c_char,
        server: *const qr_addr,
        ca_der: *const u8,
        ca_der_len: usize,
        iters: c_long,
        out: *mut LatencyResult,
    ) -> c_int;
    fn qr_host_latency_warmup(iters: c_long) -> c_long;
    fn qr_host_latency_request(i: c_long, req: *mut u8);
}

/// Run the C client: a new engine at `gid` on `fabric` connects to `server`
/// (trusting `ca_der` for the name `localhost`), times `iters` 64-byte
/// request/responses after a warm-up (each response must equal its request),
/// and closes. Blocks the calling thread, which it busy-polls.
///
/// Errors: a negative `QR_E*` code, or -1 when the measurement failed (the C
/// side says why on stderr).
pub fn c_latency_client(
    fabric: &qr_fabric,
    gid: &str,
    server: UdAddr,
    ca_der: &[u8],
    iters: i64,
) -> Result<LatencyResult, i32> {
    let gid = CString::new(gid).map_err(|_| quic_rdma_ffi::QR_EINVAL)?;
    let iters = c_long::try_from(iters).map_err(|_| quic_rdma_ffi::QR_EINVAL)?;
    let server = qr_addr::from(server);
    let mut out = LatencyResult::default();
    // SAFETY: every pointer is to a live value of the declared C type for the
    // whole call (the C side keeps none of them after returning); `fabric`
    // outlives the engine the client makes on it, which it frees before returning.
    let rc = unsafe {
        qr_host_latency_client(
            std::ptr::from_ref(fabric).cast(),
            gid.as_ptr(),
            &server,
            ca_der.as_ptr(),
            ca_der.len(),
            iters,
            &mut out,
        )
    };
    if rc == 0 {
        Ok(out)
    } else {
        Err(rc)
    }
}

/// SHA-256 of every request a run of `iters` sends (warm-up included), built
/// by the C client's own request function: what a server must have received.
pub fn sent_request_digest(iters: i64) -> [u8; 32] {
    let iters = c_long::try_from(iters).expect("iteration count fits a C long");
    // SAFETY: a pure function of its argument.
    let warmup = unsafe { qr_host_latency_warmup(iters) };
    let mut h = Sha256::new();
    let mut req = [0u8; MSG];
    for i in -warmup..iters {
        // SAFETY: `req` is MSG (= QR_LATENCY_MSG) writable bytes.
        unsafe { qr_host_latency_request(i, req.as_mut_ptr()) };
        h.update(req);
    }
    h.finalize().into()
}
