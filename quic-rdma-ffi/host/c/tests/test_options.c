/* C tests of qr_engine_options (what msquic and quiche offer beside the core API):
 * TLS key logging, server key pinning, transport knobs, richer
 * connection statistics. Run by `cargo test -p quic-rdma-ffi-host
 * --test c_options`, also under valgrind. Prints "N passed, M failed". */
#include "quic_rdma.h"

#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* A sim fabric, a server with a self-signed certificate, a client trusting
 * it; each side with its own options (NULL: none). */
typedef struct side {
    qr_fabric *fabric;
    qr_engine *server, *client;
    uint8_t cert[8192], key[8192];
    size_t cert_len, key_len;
} side;

static int make_engine(side *s, int server, const qr_engine_options *o, qr_engine **out) {
    qr_engine_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.gid = server ? "fd00::1" : "fd00::2";
    c.routing_key = server ? 0x5e : 0xc1;
    if (server) {
        c.cert_der = s->cert; c.cert_der_len = s->cert_len;
        c.key_der = s->key; c.key_der_len = s->key_len;
    } else {
        c.ca_der = s->cert; c.ca_der_len = s->cert_len;
    }
    c.options = o;
    *out = NULL;
    return qr_engine_new(s->fabric, &c, out);
}

static int setup(side *s, const qr_engine_options *so, const qr_engine_options *co) {
    memset(s, 0, sizeof *s);
    qr_fabric_config fc;
    memset(&fc, 0, sizeof fc);
    fc.struct_size = sizeof fc;
    fc.provider = "sim";
    fc.seed = 1;
    if (qr_fabric_new(&fc, &s->fabric) != QR_OK) return -1;
    if (qr_tls_selfsigned("localhost", s->cert, sizeof s->cert, &s->cert_len, s->key,
                          sizeof s->key, &s->key_len) != QR_OK)
        return -1;
    int rc = make_engine(s, 1, so, &s->server);
    if (rc != QR_OK) return rc;
    return make_engine(s, 0, co, &s->client);
}

static void teardown(side *s) {
    qr_engine_free(s->client);
    qr_engine_free(s->server);
    qr_fabric_free(s->fabric);
}

/* Connect and poll until both sides report CONNECTED (1) or the client
 * loses the connection (0; *lost gets the event). */
static uint64_t server_conn; /* the server's id of the last connection driven */

static int drive_conn(side *s, qr_event *lost, uint64_t *conn_out) {
    qr_addr a;
    uint64_t conn = 0;
    if (qr_engine_local_addr(s->server, &a) != QR_OK) return 0;
    if (qr_connect(s->client, &a, "localhost", &conn) != QR_OK) return 0;
    qr_event ev[32];
    int c_ok = 0, s_ok = 0;
    for (long i = 0; i < 200000 && !(c_ok && s_ok); i++) {
        int n = qr_engine_poll(s->client, ev, 32);
        if (n < 0) return 0;
        for (int k = 0; k < n; k++) {
            if (ev[k].conn != conn) continue;
            if (ev[k].kind == QR_EVENT_CONNECTED) c_ok = 1;
            if (ev[k].kind == QR_EVENT_CONNECTION_LOST) {
                if (lost) *lost = ev[k];
                return 0;
            }
        }
        n = qr_engine_poll(s->server, ev, 32);
        if (n < 0) return 0;
        for (int k = 0; k < n; k++)
            if (ev[k].kind == QR_EVENT_CONNECTED) {
                s_ok = 1;
                server_conn = ev[k].conn;
            }
    }
    if (conn_out) *conn_out = conn;
    return c_ok && s_ok;
}

static int drive(side *s, qr_event *lost) { return drive_conn(s, lost, NULL); }

/* ---- TLS key logging ---- */

#define MAX_LINES 32
typedef struct keylog {
    char lines[MAX_LINES][256];
    int n, bad;
} keylog;

static void on_keylog(void *user, const char *line, size_t len) {
    keylog *k = user;
    if (strlen(line) != len || len >= sizeof k->lines[0] || k->n >= MAX_LINES) {
        k->bad++;
        return;
    }
    memcpy(k->lines[k->n++], line, len + 1);
}

static int all_hex(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)p[i]) || isupper((unsigned char)p[i])) return 0;
    return 1;
}

/* "LABEL <64 hex: client random> <hex: secret of 32 or 48 bytes>". */
static int nss_line(const char *l) {
    static const char *labels[] = {"CLIENT_HANDSHAKE_TRAFFIC_SECRET",
                                   "SERVER_HANDSHAKE_TRAFFIC_SECRET",
                                   "CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0",
                                   "EXPORTER_SECRET", "CLIENT_EARLY_TRAFFIC_SECRET"};
    const char *sp1 = strchr(l, ' ');
    if (!sp1) return 0;
    int known = 0;
    for (size_t i = 0; i < sizeof labels / sizeof labels[0]; i++)
        if ((size_t)(sp1 - l) == strlen(labels[i]) && !strncmp(l, labels[i], sp1 - l)) known = 1;
    if (!known) return 0;
    const char *random = sp1 + 1, *sp2 = strchr(random, ' ');
    if (!sp2 || sp2 - random != 64 || !all_hex(random, 64)) return 0;
    const char *secret = sp2 + 1;
    size_t sl = strlen(secret);
    return (sl == 64 || sl == 96) && all_hex(secret, sl);
}

static int has_label(const keylog *k, const char *label) {
    for (int i = 0; i < k->n; i++)
        if (!strncmp(k->lines[i], label, strlen(label)) && k->lines[i][strlen(label)] == ' ')
            return 1;
    return 0;
}

static int has_line(const keylog *k, const char *line) {
    for (int i = 0; i < k->n; i++)
        if (!strcmp(k->lines[i], line)) return 1;
    return 0;
}

/* Both ends log every secret of the handshake in the NSS format, and they
 * log the same secrets: what a capture tool needs to decrypt both ways. */
static int test_keylog_lines_match(void) {
    static keylog cl, sl;
    memset(&cl, 0, sizeof cl);
    memset(&sl, 0, sizeof sl);
    qr_engine_options so, co;
    memset(&so, 0, sizeof so);
    so.struct_size = sizeof so;
    so.keylog = on_keylog;
    so.keylog_user = &sl;
    co = so;
    co.keylog_user = &cl;
    side s;
    EXPECT(setup(&s, &so, &co) == QR_OK);
    EXPECT(cl.n == 0 && sl.n == 0);
    EXPECT(drive(&s, NULL));
    EXPECT(cl.bad == 0 && sl.bad == 0);
    EXPECT(cl.n >= 4 && cl.n == sl.n);
    for (int i = 0; i < cl.n; i++) {
        if (!nss_line(cl.lines[i])) fprintf(stderr, "bad line: %s\n", cl.lines[i]);
        EXPECT(nss_line(cl.lines[i]));
        EXPECT(has_line(&sl, cl.lines[i]));
    }
    EXPECT(has_label(&cl, "CLIENT_HANDSHAKE_TRAFFIC_SECRET"));
    EXPECT(has_label(&cl, "SERVER_HANDSHAKE_TRAFFIC_SECRET"));
    EXPECT(has_label(&cl, "CLIENT_TRAFFIC_SECRET_0"));
    EXPECT(has_label(&cl, "SERVER_TRAFFIC_SECRET_0"));
    /* One handshake, one client random on every line. */
    for (int i = 1; i < cl.n; i++)
        EXPECT(!strncmp(strchr(cl.lines[i], ' '), strchr(cl.lines[0], ' '), 65));
    teardown(&s);
    return 0;
}

/* ---- server key pinning ---- */

static int test_pins_accept_and_refuse(void) {
    side s;
    EXPECT(setup(&s, NULL, NULL) == QR_OK);
    uint8_t pins[2 * QR_PIN_SHA256_LEN];
    memset(pins, 0x77, sizeof pins);
    EXPECT(qr_tls_spki_sha256(s.cert, s.cert_len, pins + QR_PIN_SHA256_LEN) == QR_OK);
    /* Bad input: NULL, not a certificate. */
    EXPECT(qr_tls_spki_sha256(NULL, 0, pins) == QR_ENULL);
    EXPECT(qr_tls_spki_sha256(s.cert, s.cert_len, NULL) == QR_ENULL);
    EXPECT(qr_tls_spki_sha256((const uint8_t *)"junk", 4, pins) == QR_ETLS);
    EXPECT(strstr(qr_last_error(), "certificate") != NULL);
    qr_engine_free(s.client);

    /* The right pin among others: connects. */
    qr_engine_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.pin_sha256 = pins;
    o.pin_count = 2;
    EXPECT(make_engine(&s, 0, &o, &s.client) == QR_OK);
    EXPECT(drive(&s, NULL));
    qr_engine_free(s.client);

    /* Only a wrong pin (one bit off): the handshake fails with the pin code. */
    uint8_t wrong[QR_PIN_SHA256_LEN];
    memcpy(wrong, pins + QR_PIN_SHA256_LEN, sizeof wrong);
    wrong[31] ^= 1;
    o.pin_sha256 = wrong;
    o.pin_count = 1;
    EXPECT(make_engine(&s, 0, &o, &s.client) == QR_OK);
    qr_event lost;
    memset(&lost, 0, sizeof lost);
    EXPECT(!drive(&s, &lost));
    EXPECT(lost.kind == QR_EVENT_CONNECTION_LOST);
    EXPECT(lost.reason == QR_CLOSE_LOCAL_TRANSPORT);
    EXPECT(lost.code == QR_CLOSE_CODE_PIN_MISMATCH);
    qr_engine_free(s.client);

    /* Misconfigurations: refused with the fix named. */
    o.pin_count = QR_PIN_MAX + 1;
    EXPECT(make_engine(&s, 0, &o, &s.client) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "QR_PIN_MAX") != NULL);
    o.pin_sha256 = NULL;
    o.pin_count = 1;
    EXPECT(make_engine(&s, 0, &o, &s.client) == QR_ENULL);
    o.pin_sha256 = wrong;
    o.reserved = 1;
    EXPECT(make_engine(&s, 0, &o, &s.client) == QR_EINVAL);
    o.reserved = 0;
    /* Pins on an engine with no ca_der (a server): refused, naming ca_der. */
    qr_engine *srv2 = NULL;
    EXPECT(make_engine(&s, 1, &o, &srv2) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "ca_der") != NULL);
    EXPECT(srv2 == NULL);
    s.client = NULL;
    teardown(&s);
    return 0;
}

/* ---- transport knobs ---- */

static uint64_t first_cwnd(const qr_engine_options *o) {
    side s;
    if (setup(&s, NULL, o) != QR_OK) return 0;
    uint64_t conn = 0;
    uint64_t cwnd = 0;
    if (drive_conn(&s, NULL, &conn)) {
        qr_conn_stats st;
        memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        if (qr_conn_stats_get(s.client, conn, &st) == QR_OK) cwnd = st.cwnd;
    }
    teardown(&s);
    return cwnd;
}

/* The initial congestion window takes effect; the ACK delay asked of the
 * peer is accepted (its ACK_FREQUENCY frames are checked by the Rust unit
 * test options::tests); values out of range are refused with the range. */
static int test_transport_knobs(void) {
    uint64_t plain = first_cwnd(NULL);
    EXPECT(plain > 0 && plain < (1u << 20));
    qr_engine_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.initial_cwnd = 4u << 20;
    o.max_ack_delay_us = 500;
    uint64_t big = first_cwnd(&o);
    EXPECT(big >= (4u << 20) && big < (5u << 20));

    side s;
    EXPECT(setup(&s, NULL, NULL) == QR_OK);
    qr_engine_free(s.client);
    s.client = NULL;
    o.max_ack_delay_us = 0;
    o.initial_cwnd = 100; /* below 2 datagrams */
    EXPECT(make_engine(&s, 0, &o, &s.client) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "initial_cwnd 100 is out of range") != NULL);
    o.initial_cwnd = QR_INITIAL_CWND_MAX + 1;
    EXPECT(make_engine(&s, 0, &o, &s.client) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "initial_cwnd") != NULL);
    o.initial_cwnd = QR_INITIAL_CWND_MAX;
    EXPECT(make_engine(&s, 0, &o, &s.client) == QR_OK);
    qr_engine_free(s.client);
    s.client = NULL;
    o.initial_cwnd = 0;
    o.max_ack_delay_us = QR_ACK_DELAY_MAX_US + 1;
    EXPECT(make_engine(&s, 0, &o, &s.client) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "max_ack_delay_us") != NULL);
    o.max_ack_delay_us = 0;
    o.reserved2 = 1;
    EXPECT(make_engine(&s, 0, &o, &s.client) == QR_EINVAL);
    teardown(&s);
    return 0;
}

/* ---- richer statistics ---- */

/* 256 KiB over a stream: the client's qr_conn_stats v3 fields have RTT
 * samples, a minimum no larger than the smoothed RTT, a variation and the
 * handshake time; a caller of the v2 struct gets only its prefix. */
static int test_richer_conn_stats(void) {
    side s;
    EXPECT(setup(&s, NULL, NULL) == QR_OK);
    uint64_t conn = 0;
    EXPECT(drive_conn(&s, NULL, &conn));
    qr_conn_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT(qr_conn_stats_get(s.client, conn, &st) == QR_OK);
    EXPECT(st.handshake_ns > 0 && st.handshake_ns < 10000000000ull);
    uint64_t samples_after_handshake = st.rtt_samples;
    EXPECT(samples_after_handshake > 0);

    uint64_t stream = 0;
    EXPECT(qr_stream_open(s.client, conn, 1, &stream) == QR_OK);
    static uint8_t data[1 << 18], buf[1 << 16];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 31 + 7);
    size_t sent = 0, got = 0;
    int fin = 0;
    uint64_t sum_sent = 0, sum_got = 0;
    qr_event ev[32];
    for (long i = 0; i < 2000000 && !fin; i++) {
        if (sent < sizeof data) {
            int64_t n = qr_stream_write(s.client, conn, stream, data + sent, sizeof data - sent);
            if (n > 0) {
                for (int64_t k = 0; k < n; k++) sum_sent += data[sent + k];
                sent += (size_t)n;
                if (sent == sizeof data) EXPECT(qr_stream_finish(s.client, conn, stream) == QR_OK);
            } else {
                EXPECT(n == QR_EAGAIN);
            }
        }
        EXPECT(qr_engine_poll(s.client, ev, 32) >= 0);
        EXPECT(qr_engine_poll(s.server, ev, 32) >= 0);
        for (;;) {
            int32_t f = 0;
            int64_t n = qr_stream_read(s.server, server_conn, stream, buf, sizeof buf, &f);
            if (n > 0) {
                for (int64_t k = 0; k < n; k++) sum_got += buf[k];
                got += (size_t)n;
            }
            if (f) fin = 1;
            if (n <= 0) break;
        }
    }
    EXPECT(fin && got == sizeof data && sum_got == sum_sent);
    for (int i = 0; i < 200; i++) {
        qr_engine_poll(s.client, ev, 32);
        qr_engine_poll(s.server, ev, 32);
    }
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT(qr_conn_stats_get(s.client, conn, &st) == QR_OK);
    EXPECT(st.struct_size == sizeof st);
    printf("  rtt=%llu ns min=%llu ns var=%llu ns samples=%llu handshake=%llu ns "
           "congestion_events=%llu lost_bytes=%llu\n",
           (unsigned long long)st.rtt_ns, (unsigned long long)st.min_rtt_ns,
           (unsigned long long)st.rtt_var_ns, (unsigned long long)st.rtt_samples,
           (unsigned long long)st.handshake_ns, (unsigned long long)st.congestion_events,
           (unsigned long long)st.lost_bytes);
    /* The server acknowledges once per poll of a batch: few samples. */
    EXPECT(st.rtt_samples > samples_after_handshake);
    EXPECT(st.min_rtt_ns > 0 && st.min_rtt_ns <= st.rtt_ns);
    EXPECT(st.rtt_var_ns < 1000000000ull);
    /* Lossless sim: nothing lost, so no congestion event. */
    EXPECT(st.lost_bytes == 0 && st.congestion_events == 0 && st.lost_packets == 0);

    /* A caller built against version 2 gets exactly the v2 prefix. */
    struct { qr_conn_stats st; } big;
    memset(&big, 0x5a, sizeof big);
    big.st.struct_size = offsetof(qr_conn_stats, min_rtt_ns);
    EXPECT(qr_conn_stats_get(s.client, conn, &big.st) == QR_OK);
    EXPECT(big.st.struct_size == offsetof(qr_conn_stats, min_rtt_ns));
    EXPECT(big.st.datagrams_queued != 0x5a5a5a5a5a5a5a5aull);
    EXPECT(big.st.min_rtt_ns == 0x5a5a5a5a5a5a5a5aull && big.st.lost_bytes == 0x5a5a5a5a5a5a5a5aull);
    teardown(&s);
    return 0;
}

int main(void) {
    RUN(test_keylog_lines_match);
    RUN(test_pins_accept_and_refuse);
    RUN(test_transport_knobs);
    RUN(test_richer_conn_stats);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
