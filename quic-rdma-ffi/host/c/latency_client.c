/* The C latency client of examples/qr_latency.h as functions a Rust host
 * calls: its own engine on the host's fabric, connected to a server the host
 * runs (in Rust, on quic_rdma::engine, on another thread). */
#include "qr_latency.h"

int qr_host_latency_client(const qr_fabric *fabric, const char *gid, const qr_addr *server,
                           const uint8_t *ca_der, size_t ca_der_len, long iters,
                           qr_latency_result *out) {
    return qr_latency_remote(fabric, gid, server, ca_der, ca_der_len, iters, out);
}

/* The bytes the client sends, for the host's end-to-end digest. */
long qr_host_latency_warmup(long iters) { return qr_latency_warmup(iters); }

void qr_host_latency_request(long i, uint8_t req[QR_LATENCY_MSG]) { qr_latency_request(i, req); }
