/* C tests of the API's contract (issue 29, C API gaps 2-5): bounded configs,
 * qr_last_error per call, the readiness fd's own code, versioned structs from a
 * newer header.
 * Run by `cargo test -p quic-rdma-ffi-host` (tests/c_api.rs), also under
 * valgrind. Prints "N passed, M failed". */
#include "qr_pair.h"

#include <math.h>
#include <stddef.h>

static int passed, failed;

#define EXPECT(cond)                                                                  \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: expected %s (last error: \"%s\")\n", __FILE__,    \
                    __LINE__, #cond, qr_last_error());                                \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

#define RUN(t)                                                                        \
    do {                                                                              \
        int r_ = t();                                                                 \
        printf("test %s ... %s\n", #t, r_ ? "FAILED" : "ok");                         \
        if (r_) failed++; else passed++;                                              \
    } while (0)

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
    EXPECT(qr_engine_new(f, &c, &e) == QR_OK && e != NULL);
    qr_engine_free(e);
    e = NULL;
    c = client_config("fd00::41");
    c.recv_depth = QR_QUEUE_MIN;
    c.send_slots = QR_QUEUE_MAX;
    c.stream_window = QR_WINDOW_MIN;
    c.conn_window = QR_WINDOW_MIN;
    EXPECT(qr_engine_new(f, &c, &e) == QR_OK && e != NULL);
    qr_engine_free(e);
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

int main(void) {
    RUN(test_config_values_are_bounded);
    RUN(test_last_error_is_per_call);
    RUN(test_readiness_fd_codes);
    RUN(test_newer_struct_tail);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
