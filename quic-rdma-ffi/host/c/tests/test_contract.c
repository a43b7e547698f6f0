/* C tests of the API's contract: bounded configs,
 * qr_last_error per call, the readiness fd's own code, versioned structs from a
 * newer header, datagrams dropped on receive (counted, signalled, sized).
 * Run by `cargo test -p quic-rdma-ffi-host` (tests/c_api.rs), also under
 * valgrind. Prints "N passed, M failed". */
#include "qr_pair.h"

#include <math.h>
#include <stddef.h>

#include "check.h"

static qr_fabric *sim_fabric(void) {
    qr_fabric_config fc;
    memset(&fc, 0, sizeof fc);
    fc.struct_size = sizeof fc;
    fc.provider = "sim";
    qr_fabric *f = NULL;
    QR_CHECK(qr_fabric_new(&fc, &f));
    return f;
}

static qr_engine_config client_config(const char *gid) {
    qr_engine_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.gid = gid;
    return c;
}

/* Gap 3: out-of-range numbers are refused with QR_EINVAL and a message naming
 * the field, never accepted (recv_depth = send_slots = 1e8 used to abort the
 * process allocating them); the bounds themselves are accepted. */
static int test_config_values_are_bounded(void) {
    qr_fabric *f = sim_fabric();
    qr_engine *e = NULL;
    qr_engine_config c = client_config("fd00::41");
    c.recv_depth = 100000000;
    c.send_slots = 100000000;
    EXPECT(qr_engine_new(f, &c, &e) == QR_EINVAL && e == NULL);
    EXPECT(strstr(qr_last_error(), "recv_depth 100000000 is out of range") != NULL);
    c.recv_depth = 0;
    EXPECT(qr_engine_new(f, &c, &e) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "send_slots") != NULL);

    static const char *const field[] = {"recv_batch",    "recv_depth",  "send_slots",
                                        "stream_window", "conn_window", "max_bidi_streams",
                                        "max_uni_streams"};
    for (size_t i = 0; i < sizeof field / sizeof field[0]; i++) {
        for (int high = 0; high < 2; high++) {
            c = client_config("fd00::41");
            switch (i) {
            case 0: c.recv_batch = high ? QR_RECV_BATCH_MAX + 1 : 0xffffffffu; break;
            case 1: c.recv_depth = high ? QR_QUEUE_MAX + 1 : QR_QUEUE_MIN - 1; break;
            case 2: c.send_slots = high ? QR_QUEUE_MAX + 1 : QR_QUEUE_MIN - 1; break;
            case 3: c.stream_window = high ? QR_STREAM_WINDOW_MAX + 1 : QR_WINDOW_MIN - 1; break;
            case 4: c.conn_window = high ? QR_CONN_WINDOW_MAX + 1 : 1; break;
            case 5: c.max_bidi_streams = high ? QR_STREAMS_MAX + 1 : 0xffffffffu; break;
            case 6: c.max_uni_streams = high ? 0xffffffffu : QR_STREAMS_MAX + 1; break;
            }
            EXPECT(qr_engine_new(f, &c, &e) == QR_EINVAL && e == NULL);
            EXPECT(strstr(qr_last_error(), field[i]) != NULL);
            EXPECT(strstr(qr_last_error(), "out of range") != NULL);
        }
    }
    /* Every bound itself is accepted. */
    c = client_config("fd00::41");
    c.recv_batch = QR_RECV_BATCH_MAX;
    c.recv_depth = QR_QUEUE_MAX;
    c.send_slots = QR_QUEUE_MIN;
    c.stream_window = QR_STREAM_WINDOW_MAX;
    c.conn_window = QR_CONN_WINDOW_MAX;
    c.max_bidi_streams = QR_STREAMS_MAX;
    c.max_uni_streams = 1;
    c.datagram_recv_buffer = QR_DATAGRAM_BUFFER_MAX;
    EXPECT(qr_engine_new(f, &c, &e) == QR_OK && e != NULL);
    qr_engine_free(e);
    e = NULL;
    c = client_config("fd00::41");
    c.recv_depth = QR_QUEUE_MIN;
    c.send_slots = QR_QUEUE_MAX;
    c.stream_window = QR_WINDOW_MIN;
    c.conn_window = QR_WINDOW_MIN;
    c.datagram_recv_buffer = QR_DATAGRAM_BUFFER_MIN;
    EXPECT(qr_engine_new(f, &c, &e) == QR_OK && e != NULL);
    qr_engine_free(e);
    e = NULL;
    c.datagram_recv_buffer = QR_DATAGRAM_BUFFER_MIN - 1;
    EXPECT(qr_engine_new(f, &c, &e) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "datagram_recv_buffer") != NULL);
    c.datagram_recv_buffer = QR_DATAGRAM_BUFFER_MAX + 1;
    EXPECT(qr_engine_new(f, &c, &e) == QR_EINVAL);
    qr_fabric_free(f);

    /* The fabric's probabilities: [0, 1], NaN refused too. */
    qr_fabric_config fc;
    memset(&fc, 0, sizeof fc);
    fc.struct_size = sizeof fc;
    fc.provider = "sim";
    fc.loss = 1.5;
    EXPECT(qr_fabric_new(&fc, &f) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "[0, 1]") != NULL);
    fc.loss = NAN;
    EXPECT(qr_fabric_new(&fc, &f) == QR_EINVAL);
    return 0;
}

/* Gap 4: qr_last_error describes the last call only: a success (or a data-path
 * code) after a failure leaves it empty, not the failure's stale message. */
static int test_last_error_is_per_call(void) {
    qr_fabric *f = sim_fabric();
    EXPECT(qr_last_error() != NULL && qr_last_error()[0] == 0);
    qr_engine *e = NULL;
    qr_engine_config c = client_config("fd00::42");
    c.retry_policy = 3;
    EXPECT(qr_engine_new(f, &c, &e) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "retry_policy") != NULL);
    c.retry_policy = QR_RETRY_AUTO;
    EXPECT(qr_engine_new(f, &c, &e) == QR_OK);
    EXPECT(strcmp(qr_last_error(), "") == 0);
    /* Reading it twice does not clear it; the next call does. */
    EXPECT(qr_set_panic_policy(9) == QR_EINVAL);
    EXPECT(qr_last_error()[0] != 0 && qr_last_error()[0] != 0);
    EXPECT(qr_engine_mtu(e) == 4096);
    EXPECT(qr_last_error()[0] == 0);
    /* A failure whose code says all records nothing, and clears the old one. */
    EXPECT(qr_set_panic_policy(9) == QR_EINVAL);
    uint8_t b[8];
    EXPECT(qr_datagram_recv(e, 12345, b, sizeof b, NULL) == QR_ENOCONN);
    EXPECT(qr_last_error()[0] == 0);
    qr_engine_free(e);
    qr_fabric_free(f);
    return 0;
}

/* Gap 4: "no descriptor" has its own code, distinct from QR_ENULL (-1). */
static int test_readiness_fd_codes(void) {
    EXPECT(QR_ENOFD != QR_ENULL && QR_ENOFD < 0);
    EXPECT(strcmp(qr_strerror(QR_ENOFD), "unknown error code") != 0);
    EXPECT(qr_engine_readiness_fd(NULL) == QR_ENULL);
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_engine_readiness_fd(p.client) == QR_ENOFD);
    qr_pair_free(&p);
    qr_pair_init(&p, "soft");
    EXPECT(qr_engine_readiness_fd(p.client) >= 0);
    EXPECT(qr_engine_readiness_fd(p.server) >= 0);
    qr_pair_free(&p);
    return 0;
}

/* Gap 4: a caller built against a newer header passes a larger struct: its
 * unknown tail must be zero (accepted, defaults) or the call is refused. */
static int test_newer_struct_tail(void) {
    struct newer_fabric { qr_fabric_config c; uint64_t later; } nf;
    memset(&nf, 0, sizeof nf);
    nf.c.struct_size = sizeof nf;
    nf.c.provider = "sim";
    qr_fabric *f = NULL;
    EXPECT(qr_fabric_new(&nf.c, &f) == QR_OK);
    nf.later = 1;
    qr_fabric *g = NULL;
    EXPECT(qr_fabric_new(&nf.c, &g) == QR_EINVAL && g == NULL);
    EXPECT(strstr(qr_last_error(), "newer header") != NULL);

    struct newer_engine { qr_engine_config c; uint32_t later[4]; } ne;
    memset(&ne, 0, sizeof ne);
    ne.c.struct_size = sizeof ne;
    ne.c.gid = "fd00::43";
    qr_engine *e = NULL;
    EXPECT(qr_engine_new(f, &ne.c, &e) == QR_OK);
    qr_engine_free(e);
    e = NULL;
    ne.later[3] = 0x100;
    EXPECT(qr_engine_new(f, &ne.c, &e) == QR_EINVAL && e == NULL);
    EXPECT(strstr(qr_last_error(), "qr_engine_config") != NULL);
    /* An uninitialised-looking size is refused before anything is read. */
    ne.later[3] = 0;
    ne.c.struct_size = 0x7fffffff;
    EXPECT(qr_engine_new(f, &ne.c, &e) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "struct_size") != NULL);
    qr_fabric_free(f);
    return 0;
}

/* A sim pair whose server holds `dgram_buffer` bytes of received datagrams
 * (0: the default). */
static void pair_with_buffer(qr_pair *p, uint64_t dgram_buffer) {
    memset(p, 0, sizeof *p);
    p->fabric = sim_fabric();
    static uint8_t cert[8192], key[8192];
    size_t cl = 0, kl = 0;
    QR_CHECK(qr_tls_selfsigned("localhost", cert, sizeof cert, &cl, key, sizeof key, &kl));
    qr_engine_config sc = client_config("fd00::1");
    sc.cert_der = cert;
    sc.cert_der_len = cl;
    sc.key_der = key;
    sc.key_der_len = kl;
    sc.datagram_recv_buffer = dgram_buffer;
    QR_CHECK(qr_engine_new(p->fabric, &sc, &p->server));
    qr_engine_config cc = client_config("fd00::2");
    cc.ca_der = cert;
    cc.ca_der_len = cl;
    QR_CHECK(qr_engine_new(p->fabric, &cc, &p->client));
}

/* The client sends N datagrams of LEN bytes (numbered); the server polls but
 * reads none until all N arrived, then reads what is left. Returns 0 when the
 * drops were counted (conn and engine stats), signalled (the events' codes
 * add up to the same number) and the survivors are the newest, in order. */
static int datagrams_unread(uint64_t dgram_buffer, long expect_readable) {
    enum { N = 5000, LEN = 1000 };
    qr_pair p;
    pair_with_buffer(&p, dgram_buffer);
    EXPECT(qr_pair_connect(&p) == 0);
    static uint8_t msg[LEN], buf[LEN];
    memset(msg, 0, sizeof msg);
    qr_conn_stats st;
    memset(&st, 0, sizeof st);
    int sent = 0, events = 0;
    uint64_t signalled = 0;
    for (unsigned long long i = 0; i < QR_PAIR_MAX_SPINS; i++) {
        while (sent < N) {
            memcpy(msg, &sent, sizeof sent);
            int rc = qr_datagram_send(p.client, p.client_conn, msg, sizeof msg);
            if (rc == QR_EAGAIN) break;
            EXPECT(rc == QR_OK);
            sent++;
        }
        qr_pair_step(&p);
        for (int k = 0; k < p.nsev; k++)
            if (p.sev[k].kind == QR_EVENT_DATAGRAMS_DROPPED) {
                EXPECT(p.sev[k].conn == p.server_conn && p.sev[k].code > 0);
                signalled += p.sev[k].code;
                events++;
            }
        st.struct_size = sizeof st;
        EXPECT(qr_conn_stats_get(p.server, p.server_conn, &st) == QR_OK);
        if (sent == N && st.datagrams_received == N) break;
    }
    EXPECT(st.struct_size == sizeof st && st.datagrams_received == N);
    EXPECT(st.datagrams_queued + st.datagrams_dropped == N);
    EXPECT(st.datagrams_dropped == signalled);
    qr_socket_stats ss;
    memset(&ss, 0, sizeof ss);
    ss.struct_size = sizeof ss;
    EXPECT(qr_socket_stats_get(p.server, &ss) == QR_OK);
    EXPECT(ss.datagrams_dropped == st.datagrams_dropped);
    long readable = 0;
    long long r;
    while ((r = qr_datagram_recv(p.server, p.server_conn, buf, sizeof buf, NULL)) > 0) {
        int seq;
        EXPECT(r == LEN);
        memcpy(&seq, buf, sizeof seq);
        /* The oldest went: the survivors are the newest, in order. */
        EXPECT(seq == (int)st.datagrams_dropped + (int)readable);
        readable++;
    }
    EXPECT(r == QR_EAGAIN);
    printf("  buffer %llu: %d sent, %llu received, %ld readable, %llu dropped "
           "(%d QR_EVENT_DATAGRAMS_DROPPED events)\n",
           (unsigned long long)dgram_buffer, N, (unsigned long long)st.datagrams_received,
           readable, (unsigned long long)st.datagrams_dropped, events);
    EXPECT(readable == expect_readable);
    EXPECT((uint64_t)readable + signalled == N);
    EXPECT((events > 0) == (signalled > 0));
    st.struct_size = sizeof st;
    EXPECT(qr_conn_stats_get(p.server, p.server_conn, &st) == QR_OK);
    EXPECT(st.datagrams_queued == 0 && st.datagrams_dropped == signalled);
    qr_pair_free(&p);
    return 0;
}

/* Gap 2: with the default 4 MiB buffer, 5000 unread 1000-byte datagrams
 * overflow it (once 4064 were readable and 936 lost without a trace);
 * now every drop is counted and signalled, and the buffer is configurable. */
static int test_datagram_drops_counted_signalled_sized(void) {
    /* 4 MiB / (1000 + 32 bytes each) = 4064. */
    EXPECT(datagrams_unread(0, (4 << 20) / 1032) == 0);
    /* Large enough for all. */
    EXPECT(datagrams_unread(16 << 20, 5000) == 0);
    /* The smallest: 16384 / 1032 = 15. */
    EXPECT(datagrams_unread(QR_DATAGRAM_BUFFER_MIN, QR_DATAGRAM_BUFFER_MIN / 1032) == 0);
    return 0;
}

int main(void) {
    RUN(test_config_values_are_bounded);
    RUN(test_last_error_is_per_call);
    RUN(test_readiness_fd_codes);
    RUN(test_newer_struct_tail);
    RUN(test_datagram_drops_counted_signalled_sized);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
