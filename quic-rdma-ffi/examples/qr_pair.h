/* Helpers shared by the C examples and the C tests: a client and a server
 * engine on one in-process fabric ("sim"), driven by one loop. */
#ifndef QR_PAIR_H
#define QR_PAIR_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quic_rdma.h"

#define QR_CHECK(expr)                                                              \
    do {                                                                            \
        long long qr_rc_ = (long long)(expr);                                       \
        if (qr_rc_ < 0) {                                                           \
            fprintf(stderr, "%s:%d: %s failed: %lld (%s)\n", __FILE__, __LINE__,    \
                    #expr, qr_rc_, qr_strerror((int)qr_rc_));                      \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

#define QR_PAIR_EVENTS 64
#define QR_PAIR_MAX_SPINS 50000000ULL

typedef struct qr_pair {
    qr_fabric *fabric;
    qr_engine *server;
    qr_engine *client;
    uint64_t client_conn;
    uint64_t server_conn;
    qr_event cev[QR_PAIR_EVENTS];
    qr_event sev[QR_PAIR_EVENTS];
    int ncev, nsev;
} qr_pair;

/* Fabric (MTU 4096), self-signed cert, server and client engines. Over "sim"
 * the GIDs are fd00::1 / fd00::2; over "soft" they are loopback addresses (each
 * its own port, RoCEv2 on UDP 4791). */
static inline void qr_pair_init(qr_pair *p, const char *provider) {
    memset(p, 0, sizeof *p);
    qr_fabric_config fc;
    memset(&fc, 0, sizeof fc);
    fc.struct_size = sizeof fc;
    fc.provider = provider;
    fc.mtu = 4096;
    fc.seed = 1;
    QR_CHECK(qr_fabric_new(&fc, &p->fabric));

    static uint8_t cert[8192], key[8192];
    size_t cert_len = 0, key_len = 0;
    QR_CHECK(qr_tls_selfsigned("localhost", cert, sizeof cert, &cert_len, key, sizeof key,
                               &key_len));

    qr_engine_config sc;
    memset(&sc, 0, sizeof sc);
    sc.struct_size = sizeof sc;
    sc.accept_policy = QR_ACCEPT_ALL;
    int soft = provider && strcmp(provider, "soft") == 0;
    sc.gid = soft ? "127.0.0.231" : "fd00::1";
    sc.routing_key = 0x5e;
    sc.cert_der = cert;
    sc.cert_der_len = cert_len;
    sc.key_der = key;
    sc.key_der_len = key_len;
    QR_CHECK(qr_engine_new(p->fabric, &sc, &p->server));

    qr_engine_config cc;
    memset(&cc, 0, sizeof cc);
    cc.struct_size = sizeof cc;
    cc.gid = soft ? "127.0.0.232" : "fd00::2";
    cc.routing_key = 0xc1;
    cc.ca_der = cert;
    cc.ca_der_len = cert_len;
    QR_CHECK(qr_engine_new(p->fabric, &cc, &p->client));
}

/* Poll both engines once; events land in cev/sev. */
static inline void qr_pair_step(qr_pair *p) {
    p->ncev = qr_engine_poll(p->client, p->cev, QR_PAIR_EVENTS);
    QR_CHECK(p->ncev);
    p->nsev = qr_engine_poll(p->server, p->sev, QR_PAIR_EVENTS);
    QR_CHECK(p->nsev);
}

/* Handshake; fills client_conn / server_conn. Returns 0 on success. */
static inline int qr_pair_connect(qr_pair *p) {
    qr_addr server;
    QR_CHECK(qr_engine_local_addr(p->server, &server));
    QR_CHECK(qr_connect(p->client, &server, "localhost", &p->client_conn));
    int c_ok = 0, s_ok = 0;
    for (unsigned long long i = 0; i < QR_PAIR_MAX_SPINS && !(c_ok && s_ok); i++) {
        qr_pair_step(p);
        for (int k = 0; k < p->ncev; k++)
            if (p->cev[k].kind == QR_EVENT_CONNECTED && p->cev[k].conn == p->client_conn)
                c_ok = 1;
        for (int k = 0; k < p->nsev; k++)
            if (p->sev[k].kind == QR_EVENT_CONNECTED) {
                p->server_conn = p->sev[k].conn;
                s_ok = 1;
            }
    }
    return c_ok && s_ok ? 0 : -1;
}

static inline void qr_pair_free(qr_pair *p) {
    qr_engine_free(p->client);
    qr_engine_free(p->server);
    qr_fabric_free(p->fabric);
}

#endif
