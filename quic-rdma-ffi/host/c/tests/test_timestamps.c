/* C tests of completion time stamps (issue 29, C API gap 7): off by default,
 * enabled per engine, read per datagram, per connection and per send, on the
 * timeline of qr_event.time_ns. Over "sim" and "soft".
 * Run by `cargo test -p quic-rdma-ffi-host` (tests/c_timestamps.rs), also
 * under AddressSanitizer. Prints "N passed, M failed". */
#include "qr_pair.h"

#include <time.h>

#include "check.h"

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Step until the server reports QR_EVENT_DATAGRAM; its poll time, or 0. */
static uint64_t await_datagram(qr_pair *p) {
    for (unsigned long long i = 0; i < QR_PAIR_MAX_SPINS; i++) {
        qr_pair_step(p);
        for (int k = 0; k < p->nsev; k++)
            if (p->sev[k].kind == QR_EVENT_DATAGRAM) return p->sev[k].time_ns;
    }
    return 0;
}

static qr_timestamp stamp(void) {
    qr_timestamp t;
    memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    return t;
}

static int test_off_by_default(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    EXPECT(qr_datagram_send(p.client, p.client_conn, (const uint8_t *)"x", 1) == QR_OK);
    EXPECT(await_datagram(&p) != 0);
    qr_timestamp t = stamp();
    EXPECT(qr_datagram_timestamp(p.server, p.server_conn, &t) == QR_EAGAIN);
    EXPECT(strstr(qr_last_error(), "qr_engine_enable_timestamps") != NULL);
    EXPECT(qr_conn_rx_timestamp(p.server, p.server_conn, &t) == QR_EAGAIN);
    EXPECT(qr_engine_send_timestamp(p.client, &t) == QR_EAGAIN);
    qr_pair_free(&p);
    return 0;
}

static int test_bad_arguments(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    qr_timestamp t = stamp();
    EXPECT(qr_engine_enable_timestamps(NULL, NULL) == QR_ENULL);
    EXPECT(qr_engine_enable_timestamps(p.server, NULL) == QR_OK);
    EXPECT(qr_datagram_timestamp(p.server, 12345, &t) == QR_ENOCONN);
    EXPECT(qr_conn_rx_timestamp(p.server, 12345, &t) == QR_ENOCONN);
    EXPECT(qr_engine_send_timestamp(p.server, NULL) == QR_ENULL);
    qr_pair_free(&p);
    return 0;
}

/* Five datagrams, one at a time: each stamp is on `clock`, inside the
 * window of its exchange, no later than the poll that reported it, and no
 * earlier than the one before. The client's sends are stamped too. */
static int exchange(const char *provider, uint32_t want_clock) {
    qr_pair p;
    qr_pair_init(&p, provider);
    EXPECT(qr_pair_connect(&p) == 0);
    uint32_t clock = 0;
    EXPECT(qr_engine_enable_timestamps(p.server, &clock) == QR_OK);
    EXPECT(clock == want_clock);
    EXPECT(qr_engine_enable_timestamps(p.client, &clock) == QR_OK);
    EXPECT(clock == want_clock);
    uint64_t prev = 0;
    for (int i = 0; i < 5; i++) {
        uint8_t msg[64], buf[64];
        memset(msg, 'a' + i, sizeof msg);
        uint64_t before = mono_ns();
        EXPECT(qr_datagram_send(p.client, p.client_conn, msg, sizeof msg) == QR_OK);
        uint64_t polled = await_datagram(&p);
        uint64_t after = mono_ns();
        EXPECT(polled != 0);
        qr_timestamp t = stamp();
        EXPECT(qr_datagram_timestamp(p.server, p.server_conn, &t) == QR_OK);
        EXPECT(t.struct_size == sizeof t && t.clock == want_clock);
        EXPECT(before <= t.ns && t.ns <= after);
        EXPECT(t.ns >= prev);
        prev = t.ns;
        /* The stamp belongs to this datagram: read it, then none is waiting. */
        EXPECT(qr_datagram_recv(p.server, p.server_conn, buf, sizeof buf, NULL) == 64);
        EXPECT(memcmp(buf, msg, sizeof msg) == 0);
        EXPECT(qr_datagram_timestamp(p.server, p.server_conn, &t) == QR_EAGAIN);
        qr_timestamp rx = stamp();
        EXPECT(qr_conn_rx_timestamp(p.server, p.server_conn, &rx) == QR_OK);
        if (!(rx.clock == want_clock && prev <= rx.ns && rx.ns <= after))
            fprintf(stderr, "rx clock %u ns %llu prev %llu after %llu\n", rx.clock,
                    (unsigned long long)rx.ns, (unsigned long long)prev, (unsigned long long)after);
        EXPECT(rx.clock == want_clock && prev <= rx.ns && rx.ns <= after);
    }
    /* Sends are signaled one in 16: push enough through that one is reaped. */
    uint64_t before = mono_ns();
    for (int i = 0; i < 64; i++) {
        EXPECT(qr_datagram_send(p.client, p.client_conn, (const uint8_t *)"s", 1) == QR_OK);
        qr_pair_step(&p);
    }
    for (int i = 0; i < 1000; i++) qr_pair_step(&p);
    uint64_t after = mono_ns();
    qr_timestamp s = stamp();
    EXPECT(qr_engine_send_timestamp(p.client, &s) == QR_OK);
    EXPECT(s.clock == want_clock && before <= s.ns && s.ns <= after);
    qr_pair_free(&p);
    return 0;
}

static int test_sim_stamps(void) { return exchange("sim", QR_CLOCK_SIM_FABRIC); }

static int test_soft_stamps(void) { return exchange("soft", QR_CLOCK_HOST_MONOTONIC); }

/* `--sim-only` (the valgrind run): memcheck reports soft's sendmsg of
 * ciphertext as uninitialised bytes (ring's assembly output, not covered by
 * valgrind.supp), so under valgrind only the sim tests run. */
int main(int argc, char **argv) {
    int sim_only = argc > 1 && strcmp(argv[1], "--sim-only") == 0;
    RUN(test_off_by_default);
    RUN(test_bad_arguments);
    RUN(test_sim_stamps);
    if (!sim_only) RUN(test_soft_stamps);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
