/* 64-byte request/response latency over quic-rdma: client and server engines
 * in one process on the in-process "sim" fabric, driven by one busy-poll loop.
 * Prints p50/p99/p999 of the round-trip time.
 *
 *   latency [iterations] [provider]      (defaults: 100000 sim)
 */
#include "qr_pair.h"

#define MSG 64

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Read exactly `len` bytes (polling both sides meanwhile). */
static void read_exact(qr_pair *p, qr_engine *e, uint64_t conn, uint64_t stream, uint8_t *buf,
                       size_t len) {
    size_t got = 0;
    for (unsigned long long spins = 0; got < len; spins++) {
        if (spins > QR_PAIR_MAX_SPINS) {
            fprintf(stderr, "no response\n");
            exit(1);
        }
        long long n = qr_stream_read(e, conn, stream, buf + got, len - got, NULL);
        if (n == QR_EAGAIN) {
            qr_pair_step(p);
            continue;
        }
        QR_CHECK(n);
        got += (size_t)n;
    }
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 100000;
    const char *provider = argc > 2 ? argv[2] : "sim";
    long warmup = iters / 10 + 100;
    qr_pair p;
    qr_pair_init(&p, provider);
    if (qr_pair_connect(&p) != 0) {
        fprintf(stderr, "handshake failed\n");
        return 1;
    }
    uint64_t stream;
    QR_CHECK(qr_stream_open(p.client, p.client_conn, 1, &stream));
    uint64_t *rtt = calloc((size_t)iters, sizeof *rtt);
    if (!rtt) return 1;
    uint8_t req[MSG], resp[MSG], srv[MSG];
    memset(req, 0xab, sizeof req);
    for (long i = -warmup; i < iters; i++) {
        memcpy(req, &i, sizeof i);
        uint64_t t0 = qr_now_ns();
        QR_CHECK(qr_stream_write(p.client, p.client_conn, stream, req, MSG));
        read_exact(&p, p.server, p.server_conn, stream, srv, MSG);
        QR_CHECK(qr_stream_write(p.server, p.server_conn, stream, srv, MSG));
        read_exact(&p, p.client, p.client_conn, stream, resp, MSG);
        uint64_t t1 = qr_now_ns();
        if (memcmp(req, resp, MSG) != 0) {
            fprintf(stderr, "response mismatch at %ld\n", i);
            return 1;
        }
        if (i >= 0) rtt[i] = t1 - t0;
    }
    qsort(rtt, (size_t)iters, sizeof *rtt, cmp_u64);
    printf("provider=%s iterations=%ld msg=%d bytes\n", provider, iters, MSG);
    printf("rtt p50=%.2f us p99=%.2f us p999=%.2f us max=%.2f us\n",
           rtt[(size_t)(iters * 0.50)] / 1000.0, rtt[(size_t)(iters * 0.99)] / 1000.0,
           rtt[(size_t)(iters * 0.999)] / 1000.0, rtt[iters - 1] / 1000.0);
    free(rtt);
    QR_CHECK(qr_close(p.client, p.client_conn, 0, (const uint8_t *)"done", 4));
    for (int i = 0; i < 1000; i++) qr_pair_step(&p);
    qr_pair_free(&p);
    return 0;
}
