/* The 64-byte request/response measurement, shared by latency.c (client and
 * server engines in one process, both driven from C) and by hosts that run the
 * same client against a server written in Rust on quic_rdma::engine
 * (quic-rdma-ffi/host). The client only needs a connected engine and a way to
 * make progress (`step`): in one process that polls both engines; against a
 * server on another thread or host it polls the client alone. */
#ifndef QR_LATENCY_H
#define QR_LATENCY_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quic_rdma.h"

#define QR_LATENCY_MSG 64
/* Polls without progress before a request counts as unanswered. */
#define QR_LATENCY_MAX_SPINS 50000000ULL

/* Round-trip times in microseconds. */
typedef struct qr_latency_result {
    long iterations;
    double p50_us, p99_us, p999_us, max_us;
} qr_latency_result;

/* Makes progress: polls the client engine (and whatever else this thread drives). */
typedef void (*qr_latency_step_fn)(void *ctx);

static inline uint64_t qr_latency_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int qr_latency_cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Untimed request/responses before the measured ones. */
static inline long qr_latency_warmup(long iters) { return iters / 10 + 100; }

/* Request `i` (warm-up ones are negative): its sequence number, then 0xab. */
static inline void qr_latency_request(long i, uint8_t req[QR_LATENCY_MSG]) {
    memset(req, 0xab, QR_LATENCY_MSG);
    memcpy(req, &i, sizeof i);
}

/* Read exactly `len` bytes of `stream`, stepping while nothing is there. */
static inline int qr_latency_read_exact(qr_engine *e, uint64_t conn, uint64_t stream, uint8_t *buf,
                                        size_t len, qr_latency_step_fn step, void *ctx) {
    size_t got = 0;
    for (unsigned long long spins = 0; got < len; spins++) {
        if (spins > QR_LATENCY_MAX_SPINS) {
            fprintf(stderr, "latency: no response\n");
            return -1;
        }
        long long n = qr_stream_read(e, conn, stream, buf + got, len - got, NULL);
        if (n == QR_EAGAIN) {
            step(ctx);
            continue;
        }
        if (n < 0) {
            fprintf(stderr, "latency: read: %s\n", qr_strerror((int)n));
            return -1;
        }
        got += (size_t)n;
    }
    return 0;
}

/* Open a bidirectional stream on `conn` and time `iters` request/responses of
 * QR_LATENCY_MSG bytes after a warm-up, checking that every response equals
 * its request (each request carries its sequence number, so a stale or
 * misordered echo fails). Returns 0 with `*out` filled, or -1. */
static inline int qr_latency_run(qr_engine *client, uint64_t conn, long iters,
                                 qr_latency_step_fn step, void *ctx, qr_latency_result *out) {
    if (iters <= 0) return -1;
    long warmup = qr_latency_warmup(iters);
    uint64_t stream;
    int32_t rc = qr_stream_open(client, conn, 1, &stream);
    if (rc < 0) {
        fprintf(stderr, "latency: stream open: %s\n", qr_strerror(rc));
        return -1;
    }
    uint64_t *rtt = calloc((size_t)iters, sizeof *rtt);
    if (!rtt) return -1;
    uint8_t req[QR_LATENCY_MSG], resp[QR_LATENCY_MSG];
    int result = -1;
    for (long i = -warmup; i < iters; i++) {
        qr_latency_request(i, req);
        uint64_t t0 = qr_latency_now_ns();
        long long n = qr_stream_write(client, conn, stream, req, sizeof req);
        if (n != (long long)sizeof req) {
            fprintf(stderr, "latency: write took %lld of %zu bytes\n", n, sizeof req);
            goto out;
        }
        if (qr_latency_read_exact(client, conn, stream, resp, sizeof resp, step, ctx) != 0)
            goto out;
        uint64_t t1 = qr_latency_now_ns();
        if (memcmp(req, resp, sizeof req) != 0) {
            fprintf(stderr, "latency: response %ld differs from its request\n", i);
            goto out;
        }
        if (i >= 0) rtt[i] = t1 - t0;
    }
    qsort(rtt, (size_t)iters, sizeof *rtt, qr_latency_cmp_u64);
    out->iterations = iters;
    out->p50_us = rtt[(size_t)(iters * 0.50)] / 1000.0;
    out->p99_us = rtt[(size_t)(iters * 0.99)] / 1000.0;
    out->p999_us = rtt[(size_t)(iters * 0.999)] / 1000.0;
    out->max_us = rtt[iters - 1] / 1000.0;
    result = 0;
out:
    free(rtt);
    return result;
}

/* A client engine polled on its own: its server runs elsewhere (another
 * thread, process or host). */
#define QR_LATENCY_EVENTS 64
typedef struct qr_latency_client {
    qr_engine *engine;
    uint64_t conn;
    qr_event ev[QR_LATENCY_EVENTS];
    int connected, lost;
} qr_latency_client;

static inline void qr_latency_client_step(void *ctx) {
    qr_latency_client *c = ctx;
    int n = qr_engine_poll(c->engine, c->ev, QR_LATENCY_EVENTS);
    for (int k = 0; k < n; k++) {
        if (c->ev[k].conn != c->conn) continue;
        if (c->ev[k].kind == QR_EVENT_CONNECTED) c->connected = 1;
        if (c->ev[k].kind == QR_EVENT_CONNECTION_LOST) c->lost = 1;
    }
}

/* A new engine at `gid` on `fabric` connects to `server` (trusting `ca_der`
 * for the name "localhost"), runs the measurement, closes and is freed.
 * 0 with `*out` filled, else a negative QR_E* code, or -1 when the
 * measurement itself failed (said on stderr). */
static inline int qr_latency_remote(const qr_fabric *fabric, const char *gid,
                                    const qr_addr *server, const uint8_t *ca_der,
                                    size_t ca_der_len, long iters, qr_latency_result *out) {
    qr_engine_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.struct_size = sizeof cfg;
    cfg.gid = gid;
    cfg.routing_key = 0xc1;
    cfg.ca_der = ca_der;
    cfg.ca_der_len = ca_der_len;
    qr_latency_client c;
    memset(&c, 0, sizeof c);
    int rc = qr_engine_new(fabric, &cfg, &c.engine);
    if (rc < 0) return rc;
    rc = qr_connect(c.engine, server, "localhost", &c.conn);
    for (unsigned long long i = 0; rc == 0 && !c.connected; i++) {
        if (c.lost || i > QR_LATENCY_MAX_SPINS) rc = QR_ECONNECT;
        else qr_latency_client_step(&c);
    }
    if (rc == 0) rc = qr_latency_run(c.engine, c.conn, iters, qr_latency_client_step, &c, out);
    if (rc == 0 && c.lost) rc = QR_ECLOSED;
    if (rc == 0) {
        rc = qr_close(c.engine, c.conn, 0, (const uint8_t *)"done", 4);
        /* Let the CONNECTION_CLOSE go out before the engine is dropped. */
        for (int i = 0; i < 1000; i++) qr_latency_client_step(&c);
    }
    qr_engine_free(c.engine);
    return rc;
}

static inline void qr_latency_print(const char *provider, const char *peer,
                                    const qr_latency_result *r) {
    printf("provider=%s peer=%s iterations=%ld msg=%d bytes\n", provider, peer, r->iterations,
           QR_LATENCY_MSG);
    printf("rtt p50=%.2f us p99=%.2f us p999=%.2f us max=%.2f us\n", r->p50_us, r->p99_us,
           r->p999_us, r->max_us);
}

#endif
