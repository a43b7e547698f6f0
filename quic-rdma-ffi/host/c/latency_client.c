/* The C latency client of examples/qr_latency.h as a function a Rust host
 * calls: its own engine on the host's fabric, connected to a server the host
 * runs (in Rust, on quic_rdma::engine, on another thread). */
#include "qr_latency.h"

#define EVENTS 64

typedef struct client {
    qr_engine *engine;
    uint64_t conn;
    qr_event ev[EVENTS];
    int connected, lost;
} client;

static void client_step(void *ctx) {
    client *c = ctx;
    int n = qr_engine_poll(c->engine, c->ev, EVENTS);
    for (int k = 0; k < n; k++) {
        if (c->ev[k].conn != c->conn) continue;
        if (c->ev[k].kind == QR_EVENT_CONNECTED) c->connected = 1;
        if (c->ev[k].kind == QR_EVENT_CONNECTION_LOST) c->lost = 1;
    }
}

/* Connect from `gid` on `fabric` to `server` (trusting `ca_der`), run
 * `iters` request/responses, close. 0 with `*out` filled, else a negative
 * QR_E* code (or -1 when the measurement itself failed; see stderr). */
int qr_host_latency_client(const qr_fabric *fabric, const char *gid, const qr_addr *server,
                           const uint8_t *ca_der, size_t ca_der_len, long iters,
                           qr_latency_result *out) {
    qr_engine_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.struct_size = sizeof cfg;
    cfg.gid = gid;
    cfg.routing_key = 0xc1;
    cfg.ca_der = ca_der;
    cfg.ca_der_len = ca_der_len;
    client c;
    memset(&c, 0, sizeof c);
    int rc = qr_engine_new(fabric, &cfg, &c.engine);
    if (rc < 0) return rc;
    rc = qr_connect(c.engine, server, "localhost", &c.conn);
    for (unsigned long long i = 0; rc == 0 && !c.connected; i++) {
        if (c.lost || i > QR_LATENCY_MAX_SPINS) rc = QR_ECONNECT;
        else client_step(&c);
    }
    if (rc == 0) rc = qr_latency_run(c.engine, c.conn, iters, client_step, &c, out);
    if (rc == 0 && c.lost) rc = QR_ECLOSED;
    if (rc == 0) {
        rc = qr_close(c.engine, c.conn, 0, (const uint8_t *)"done", 4);
        /* Let the CONNECTION_CLOSE go out before the engine is dropped. */
        for (int i = 0; i < 1000; i++) client_step(&c);
    }
    qr_engine_free(c.engine);
    return rc;
}

/* The bytes the client sends, for the host's end-to-end digest. */
long qr_host_latency_warmup(long iters) { return qr_latency_warmup(iters); }

void qr_host_latency_request(long i, uint8_t req[QR_LATENCY_MSG]) { qr_latency_request(i, req); }
