/* 64-byte request/response latency over quic-rdma. Prints p50/p99/p999 of
 * the round-trip time.
 *
 *   latency [iterations] [provider]
 *       client and C echo server in one process on one fabric ("sim" or
 *       "soft"), one busy-poll loop (defaults: 100000 sim)
 *   latency --serve GID CERT_OUT [--provider P] [--service IP:PORT]
 *       C echo server at GID (an IP address) over provider P ("soft", the
 *       default, or "verbs"); writes its self-signed certificate (DER) to
 *       CERT_OUT, publishes its address on the address-exchange service
 *       IP:PORT if given, prints "ready qpn=N qkey=K", serves one
 *       connection, prints "served bytes=N"
 *   latency --connect GID SERVER_GID SERVER_QPN SERVER_QKEY CA_FILE [iterations]
 *       client over "soft" at GID against any server: this program's
 *       --serve, or one written in Rust on quic_rdma::engine
 *   latency --connect-service GID SERVICE CA_FILE [iterations] [--provider P]
 *       the same, finding the server through its address-exchange service
 *       (IP:PORT) instead of being told its QPN
 *
 * The measurement itself is qr_latency.h. */
#include <arpa/inet.h>

#include "qr_latency.h"
#include "qr_pair.h"

/* Echo what `stream` has now. Bytes echoed (0 when nothing was there), or a
 * negative code. `step` keeps the engines moving while flow control is short. */
static long long echo_once(qr_engine *e, uint64_t conn, uint64_t stream,
                           void (*step)(void *), void *ctx) {
    uint8_t buf[QR_LATENCY_MSG * 4];
    long long n = qr_stream_read(e, conn, stream, buf, sizeof buf, NULL);
    if (n == QR_EAGAIN) return 0;
    if (n < 0) return n;
    for (long long off = 0; off < n;) {
        long long w = qr_stream_write(e, conn, stream, buf + off, (size_t)(n - off));
        if (w == QR_EAGAIN) {
            step(ctx);
            continue;
        }
        if (w < 0) return w;
        off += w;
    }
    return n;
}

/* ---- one process: the C server echoes from inside the client's step ---- */

typedef struct echo_pair {
    qr_pair pair;
    uint64_t stream;
    int have_stream;
} echo_pair;

static void pair_poll(void *ctx) { qr_pair_step(&((echo_pair *)ctx)->pair); }

static void pair_step(void *ctx) {
    echo_pair *ep = ctx;
    qr_pair *p = &ep->pair;
    qr_pair_step(p);
    for (int k = 0; k < p->nsev; k++)
        if (p->sev[k].kind == QR_EVENT_STREAM_OPENED && p->sev[k].conn == p->server_conn) {
            ep->stream = p->sev[k].stream;
            ep->have_stream = 1;
        }
    if (ep->have_stream)
        QR_CHECK(echo_once(p->server, p->server_conn, ep->stream, pair_poll, ep));
}

static int run_pair(long iters, const char *provider) {
    echo_pair ep;
    memset(&ep, 0, sizeof ep);
    qr_pair_init(&ep.pair, provider);
    if (qr_pair_connect(&ep.pair) != 0) {
        fprintf(stderr, "handshake failed\n");
        return 1;
    }
    qr_latency_result r;
    if (qr_latency_run(ep.pair.client, ep.pair.client_conn, iters, pair_step, &ep, &r) != 0)
        return 1;
    qr_latency_print(provider, "c", &r);
    QR_CHECK(qr_close(ep.pair.client, ep.pair.client_conn, 0, (const uint8_t *)"done", 4));
    for (int i = 0; i < 1000; i++) qr_pair_step(&ep.pair);
    qr_pair_free(&ep.pair);
    return 0;
}

/* ---- separate processes over soft ---- */

/* A fabric of `provider`: "soft" (MTU 4096) or "verbs" (the first RDMA
 * device, port 1, its active MTU). Exits with the library's reason if not. */
static qr_fabric *fabric_of(const char *provider) {
    qr_fabric_config fc;
    memset(&fc, 0, sizeof fc);
    fc.struct_size = sizeof fc;
    fc.provider = provider;
    fc.mtu = strcmp(provider, "verbs") == 0 ? 0 : 4096;
    qr_fabric *f;
    int rc = qr_fabric_new(&fc, &f);
    if (rc < 0) {
        fprintf(stderr, "fabric %s: %s: %s\n", provider, qr_strerror(rc), qr_last_error());
        exit(1);
    }
    return f;
}

typedef struct server {
    qr_engine *e;
    qr_event ev[QR_PAIR_EVENTS];
} server;

static void server_poll(void *ctx) {
    server *s = ctx;
    QR_CHECK(qr_engine_poll(s->e, s->ev, QR_PAIR_EVENTS));
}

static int serve(const char *provider, const char *gid, const char *cert_out,
                 const char *service) {
    static uint8_t cert[8192], key[8192];
    size_t cert_len = 0, key_len = 0;
    QR_CHECK(qr_tls_selfsigned("localhost", cert, sizeof cert, &cert_len, key, sizeof key,
                               &key_len));
    FILE *f = fopen(cert_out, "wb");
    if (!f || fwrite(cert, 1, cert_len, f) != cert_len || fclose(f) != 0) {
        perror(cert_out);
        return 1;
    }
    qr_fabric *fabric = fabric_of(provider);
    qr_engine_config sc;
    memset(&sc, 0, sizeof sc);
    sc.struct_size = sizeof sc;
    sc.accept_policy = QR_ACCEPT_ALL;
    sc.gid = gid;
    sc.routing_key = 0x5e;
    sc.cert_der = cert;
    sc.cert_der_len = cert_len;
    sc.key_der = key;
    sc.key_der_len = key_len;
    server s;
    int rc = qr_engine_new(fabric, &sc, &s.e);
    if (rc < 0) {
        fprintf(stderr, "engine at %s: %s: %s\n", gid, qr_strerror(rc), qr_last_error());
        return 1;
    }
    qr_bootstrap *published = NULL;
    if (service) QR_CHECK(qr_bootstrap_serve(s.e, service, &published));
    qr_addr me;
    QR_CHECK(qr_engine_local_addr(s.e, &me));
    printf("ready qpn=%u qkey=%u\n", me.qpn, me.qkey);
    fflush(stdout);
    uint64_t conn = 0, stream = 0;
    int connected = 0, have_stream = 0, over = 0;
    long long bytes = 0;
    while (!over) {
        int n = qr_engine_poll(s.e, s.ev, QR_PAIR_EVENTS);
        QR_CHECK(n);
        for (int k = 0; k < n; k++) {
            qr_event *ev = &s.ev[k];
            if (ev->kind == QR_EVENT_CONNECTED && !connected) {
                conn = ev->conn;
                connected = 1;
            } else if (ev->kind == QR_EVENT_STREAM_OPENED && connected && ev->conn == conn) {
                stream = ev->stream;
                have_stream = 1;
            } else if (ev->kind == QR_EVENT_CONNECTION_LOST && connected && ev->conn == conn) {
                over = 1;
            }
        }
        if (have_stream && !over) {
            long long e = echo_once(s.e, conn, stream, server_poll, &s);
            /* The client closed: the stream or connection went away. */
            if (e == QR_ESTREAM || e == QR_ENOCONN || e == QR_ECLOSED || e == QR_ERESET) break;
            QR_CHECK(e);
            bytes += e;
        }
    }
    /* Let the close complete before the engine is dropped. */
    for (int i = 0; i < 1000; i++) server_poll(&s);
    printf("served bytes=%lld\n", bytes);
    qr_bootstrap_free(published);
    qr_engine_free(s.e);
    qr_fabric_free(fabric);
    return 0;
}

/* An IPv4 (mapped into a GID) or IPv6 address. */
static int parse_gid(const char *text, uint8_t gid[16]) {
    struct in_addr v4;
    if (inet_pton(AF_INET, text, &v4) == 1) {
        memset(gid, 0, 10);
        gid[10] = gid[11] = 0xff;
        memcpy(gid + 12, &v4, 4);
        return 0;
    }
    return inet_pton(AF_INET6, text, gid) == 1 ? 0 : -1;
}

static int measure(const char *provider, const char *gid, const qr_addr *server,
                   const char *peer, const char *ca_file, long iters) {
    static uint8_t ca[8192];
    FILE *f = fopen(ca_file, "rb");
    if (!f) {
        perror(ca_file);
        return 1;
    }
    size_t ca_len = fread(ca, 1, sizeof ca, f);
    fclose(f);
    qr_fabric *fabric = fabric_of(provider);
    qr_latency_result r;
    int rc = qr_latency_remote(fabric, gid, server, ca, ca_len, iters, &r);
    qr_fabric_free(fabric);
    if (rc != 0) {
        fprintf(stderr, "latency against %s: %s %s\n", peer,
                rc < -1 ? qr_strerror(rc) : "measurement failed", rc < -1 ? qr_last_error() : "");
        return 1;
    }
    qr_latency_print(provider, peer, &r);
    return 0;
}

static int connect_to(const char *gid, const char *server_gid, const char *qpn, const char *qkey,
                      const char *ca_file, long iters) {
    qr_addr server;
    memset(&server, 0, sizeof server);
    if (parse_gid(server_gid, server.gid) != 0) {
        fprintf(stderr, "not an IP address: %s\n", server_gid);
        return 1;
    }
    server.qpn = (uint32_t)strtoul(qpn, NULL, 0);
    server.qkey = (uint32_t)strtoul(qkey, NULL, 0);
    return measure("soft", gid, &server, server_gid, ca_file, iters);
}

static int connect_service(const char *provider, const char *gid, const char *service,
                           const char *ca_file, long iters) {
    qr_addr server;
    int rc = qr_bootstrap_query(service, 30000, &server);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", qr_strerror(rc), qr_last_error());
        return 1;
    }
    return measure(provider, gid, &server, service, ca_file, iters);
}

/* Take "--provider P" and "--service ADDR" out of argv wherever they are. */
static int take_options(int argc, char **argv, const char **provider, const char **service) {
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--provider") == 0) *provider = argv[++i];
        else if (i + 1 < argc && strcmp(argv[i], "--service") == 0) *service = argv[++i];
        else argv[n++] = argv[i];
    }
    return n;
}

int main(int argc, char **argv) {
    const char *provider = "soft", *service = NULL;
    if (argc > 1 && strcmp(argv[1], "--serve") == 0) {
        argc = take_options(argc, argv, &provider, &service);
        if (argc != 4) {
            fprintf(stderr,
                    "usage: latency --serve GID CERT_OUT [--provider P] [--service IP:PORT]\n");
            return 2;
        }
        return serve(provider, argv[2], argv[3], service);
    }
    if (argc > 1 && strcmp(argv[1], "--connect-service") == 0) {
        argc = take_options(argc, argv, &provider, &service);
        if (argc != 5 && argc != 6) {
            fprintf(stderr, "usage: latency --connect-service GID SERVICE CA_FILE [iterations] "
                            "[--provider P]\n");
            return 2;
        }
        return connect_service(provider, argv[2], argv[3], argv[4],
                               argc == 6 ? atol(argv[5]) : 100000);
    }
    if (argc > 1 && strcmp(argv[1], "--connect") == 0) {
        if (argc != 7 && argc != 8) {
            fprintf(stderr, "usage: latency --connect GID SERVER_GID SERVER_QPN SERVER_QKEY "
                            "CA_FILE [iterations]\n");
            return 2;
        }
        return connect_to(argv[2], argv[3], argv[4], argv[5], argv[6],
                          argc == 8 ? atol(argv[7]) : 100000);
    }
    return run_pair(argc > 1 ? atol(argv[1]) : 100000, argc > 2 ? argv[2] : "sim");
}
