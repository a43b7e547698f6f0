/* 64-byte request/response latency over quic-rdma, both ends written in C:
 * client and server engines in one process on one fabric, driven by one
 * busy-poll loop (the server echoes from inside the client's poll step).
 * Prints p50/p99/p999 of the round-trip time.
 *
 *   latency [iterations] [provider]      (defaults: 100000 sim)
 *
 * The measurement itself is qr_latency.h; quic-rdma-ffi/host runs the same
 * client against a server written in Rust on quic_rdma::engine. */
#include "qr_latency.h"
#include "qr_pair.h"

/* The C server: echoes what its stream has, from inside the client's step. */
typedef struct echo_pair {
    qr_pair pair;
    uint64_t stream;
    int have_stream;
} echo_pair;

static void echo_step(void *ctx) {
    echo_pair *ep = ctx;
    qr_pair *p = &ep->pair;
    qr_pair_step(p);
    for (int k = 0; k < p->nsev; k++)
        if (p->sev[k].kind == QR_EVENT_STREAM_OPENED && p->sev[k].conn == p->server_conn) {
            ep->stream = p->sev[k].stream;
            ep->have_stream = 1;
        }
    if (!ep->have_stream) return;
    uint8_t buf[QR_LATENCY_MSG * 4];
    long long n = qr_stream_read(p->server, p->server_conn, ep->stream, buf, sizeof buf, NULL);
    if (n == QR_EAGAIN) return;
    QR_CHECK(n);
    for (long long off = 0; off < n;) {
        long long w = qr_stream_write(p->server, p->server_conn, ep->stream, buf + off,
                                      (size_t)(n - off));
        if (w == QR_EAGAIN) {
            qr_pair_step(p);
            continue;
        }
        QR_CHECK(w);
        off += w;
    }
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 100000;
    const char *provider = argc > 2 ? argv[2] : "sim";
    echo_pair ep;
    memset(&ep, 0, sizeof ep);
    qr_pair_init(&ep.pair, provider);
    if (qr_pair_connect(&ep.pair) != 0) {
        fprintf(stderr, "handshake failed\n");
        return 1;
    }
    qr_latency_result r;
    if (qr_latency_run(ep.pair.client, ep.pair.client_conn, iters, echo_step, &ep, &r) != 0)
        return 1;
    qr_latency_print(provider, "c", &r);
    QR_CHECK(qr_close(ep.pair.client, ep.pair.client_conn, 0, (const uint8_t *)"done", 4));
    for (int i = 0; i < 1000; i++) qr_pair_step(&ep.pair);
    qr_pair_free(&ep.pair);
    return 0;
}
