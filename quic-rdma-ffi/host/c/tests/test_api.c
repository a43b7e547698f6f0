/* C tests of the quic-rdma API: handshake, stream echo verified by SHA-256,
 * datagrams, error paths. Run by `cargo test -p quic-rdma-ffi-host` (tests/c_api.rs), also under
 * AddressSanitizer and valgrind. Prints "N passed, M failed". */
#include "qr_pair.h"
#include "sha256.h"

#include <pthread.h>
#include <stddef.h>
#include <time.h>

#include "check.h"

static int test_sha256_known_answer(void) {
    sha256_ctx c;
    uint8_t d[32];
    static const uint8_t abc[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
                                    0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
                                    0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    sha256_init(&c);
    sha256_update(&c, (const uint8_t *)"abc", 3);
    sha256_final(&c, d);
    EXPECT(memcmp(d, abc, 32) == 0);
    return 0;
}

/* Every counter the library lists, by index: described by static strings,
 * found by its path, read after traffic into the caller's array; the fields
 * qr_socket_stats shares with the list agree with it. */
static int test_stat_list(void) {
    size_t n = qr_stat_count();
    EXPECT(n >= 50);
    int sent_wrs = -1, recv_wrs = -1, sent_bytes = -1, no_recv = -1, without_imm = -1;
    /* without_imm: the routing check's visitor is in the list too. */
    for (size_t i = 0; i < n; i++) {
        qr_stat_desc d;
        memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        EXPECT(qr_stat_info(i, &d) == QR_OK);
        EXPECT(d.struct_size == sizeof d);
        EXPECT(d.path && d.name && d.help && d.help[0]);
        EXPECT(d.kind == QR_STAT_COUNTER || d.kind == QR_STAT_GAUGE);
        EXPECT(d.unit <= QR_STAT_UNIT_SECONDS);
        /* path is name, or group.name */
        if (d.group) {
            size_t g = strlen(d.group);
            EXPECT(strncmp(d.path, d.group, g) == 0 && d.path[g] == '.');
            EXPECT(strcmp(d.path + g + 1, d.name) == 0);
        } else {
            EXPECT(strcmp(d.path, d.name) == 0);
        }
        EXPECT(qr_stat_find(d.path) == (int)i);
        if (strcmp(d.path, "sent_wrs") == 0) sent_wrs = (int)i;
        if (strcmp(d.path, "recv_wrs") == 0) recv_wrs = (int)i;
        if (strcmp(d.path, "sent_bytes") == 0) {
            sent_bytes = (int)i;
            EXPECT(d.unit == QR_STAT_UNIT_BYTES && d.kind == QR_STAT_COUNTER);
        }
        if (strcmp(d.path, "drops.no_recv_posted") == 0) no_recv = (int)i;
        if (strcmp(d.path, "without_imm") == 0) without_imm = (int)i;
    }
    EXPECT(sent_wrs >= 0 && recv_wrs >= 0 && sent_bytes >= 0 && no_recv >= 0 && without_imm >= 0);
    qr_stat_desc past;
    memset(&past, 0, sizeof past);
    past.struct_size = sizeof past;
    EXPECT(qr_stat_info(n, &past) == QR_EINVAL);
    EXPECT(qr_stat_find("drops.nonesuch") == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "nonesuch") != NULL);

    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    uint64_t *v = calloc(n + 1, sizeof *v);
    EXPECT(v != NULL);
    EXPECT(qr_engine_stats_read(p.client, v, n) == (int)n);
    uint64_t client_sent = v[sent_wrs];
    EXPECT(client_sent > 0 && v[recv_wrs] > 0 && v[sent_bytes] > 0);
    EXPECT(qr_engine_stats_read(p.server, v, n) == (int)n);
    uint64_t server_recv = v[recv_wrs];
    /* Datagrams out, one per step: the client's sends and the server's
     * receives grow. */
    enum { DATAGRAMS = 10 };
    for (int k = 0; k < DATAGRAMS; k++) {
        EXPECT(qr_datagram_send(p.client, p.client_conn, (const uint8_t *)"tick", 4) == QR_OK);
        for (int j = 0; j < 20; j++) qr_pair_step(&p);
    }
    /* A short array gets a prefix; the count is the whole list's. */
    v[n] = 0xabcdef;
    EXPECT(qr_engine_stats_read(p.client, v, 1) == (int)n);
    EXPECT(qr_engine_stats_read(p.client, NULL, 0) == (int)n);
    EXPECT(qr_engine_stats_read(p.client, NULL, 1) == QR_ENULL);
    EXPECT(qr_engine_stats_read(p.client, v, n) == (int)n);
    EXPECT(v[sent_wrs] > client_sent);
    EXPECT(qr_engine_stats_read(p.server, v, n) == (int)n);
    EXPECT(v[n] == 0xabcdef);
    EXPECT(v[recv_wrs] > server_recv);
    qr_socket_stats ss;
    memset(&ss, 0, sizeof ss);
    ss.struct_size = sizeof ss;
    EXPECT(qr_socket_stats_get(p.server, &ss) == QR_OK);
    /* The fixed struct and the list are the same counters. */
    EXPECT(v[sent_wrs] == ss.sent_wrs && v[recv_wrs] == ss.recv_packets);
    EXPECT(v[sent_bytes] == ss.sent_bytes && v[no_recv] == ss.drop_no_recv);
    free(v);
    qr_pair_free(&p);
    return 0;
}

static int test_handshake(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_engine_mtu(p.client) == 4096);
    EXPECT(qr_pair_connect(&p) == 0);
    qr_conn_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT(qr_conn_stats_get(p.client, p.client_conn, &st) == QR_OK);
    EXPECT(st.struct_size == sizeof st);
    EXPECT(st.mtu == 4096);
    EXPECT(st.tx_datagrams > 0 && st.rx_datagrams > 0);
    /* An older caller's smaller struct gets only the prefix it knows. */
    struct { uint32_t struct_size; uint32_t mtu; uint64_t rtt_ns; uint64_t canary; } old;
    old.struct_size = 16;
    old.canary = 0x5a5a5a5a5a5a5a5aull;
    EXPECT(qr_conn_stats_get(p.client, p.client_conn, (qr_conn_stats *)&old) == QR_OK);
    EXPECT(old.struct_size == 16 && old.mtu == 4096 && old.canary == 0x5a5a5a5a5a5a5a5aull);
    qr_socket_stats ss;
    memset(&ss, 0, sizeof ss);
    ss.struct_size = sizeof ss;
    EXPECT(qr_socket_stats_get(p.server, &ss) == QR_OK);
    EXPECT(ss.sent_wrs > 0 && ss.recv_packets > 0);
    EXPECT(qr_engine_next_timeout_us(p.client) >= 0);
    qr_pair_free(&p);
    return 0;
}

/* Client sends LEN seeded bytes; the server echoes each stream back; the client
 * checks the SHA-256 of what came back equals that of what it sent. */
/* Issue 29 #6: per-stream figures after a 4 MiB echo: both sides counted
 * every byte each way and every call that found no room or no data, both
 * ends are recorded and the ended stream stays readable. */
typedef struct {
    uint64_t writes_blocked, reads_empty;
} seen_calls;

static int check_stream_stats(qr_pair *p, uint64_t s, uint64_t ss, uint64_t len,
                              seen_calls client, seen_calls server) {
    qr_stream_stats c, v;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    /* The client's end is acknowledged within a few round trips. */
    for (int i = 0; i < 10000; i++) {
        EXPECT(qr_stream_stats_get(p->client, p->client_conn, s, &c) == QR_OK);
        if (c.flags & QR_STREAM_FINISH_ACKED) break;
        qr_pair_step(p);
    }
    EXPECT(c.struct_size == sizeof c);
    EXPECT(c.bytes_written == len && c.bytes_read == len);
    /* Exactly the calls that got QR_EAGAIN. */
    EXPECT(c.writes_blocked == client.writes_blocked);
    EXPECT(c.reads_empty == client.reads_empty);
    EXPECT(c.reads_empty > 0);
    EXPECT(c.flags == (QR_STREAM_FINISH_SENT | QR_STREAM_FINISH_ACKED | QR_STREAM_FIN_READ));
    EXPECT(c.reset_code == 0 && c.stop_code == 0);
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    EXPECT(qr_stream_stats_get(p->server, p->server_conn, ss, &v) == QR_OK);
    EXPECT(v.bytes_read == len && v.bytes_written == len);
    EXPECT(v.writes_blocked == server.writes_blocked);
    EXPECT(v.reads_empty == server.reads_empty);
    EXPECT(v.flags & QR_STREAM_FIN_READ);
    EXPECT(v.flags & QR_STREAM_FINISH_SENT);
    /* An older caller's smaller struct gets its prefix only. */
    uint8_t old[16 + 8];
    memset(old, 0xAB, sizeof old);
    ((qr_stream_stats *)old)->struct_size = 16;
    EXPECT(qr_stream_stats_get(p->client, p->client_conn, s, (qr_stream_stats *)old) == QR_OK);
    EXPECT(((qr_stream_stats *)old)->struct_size == 16);
    uint64_t written;
    memcpy(&written, old + 8, 8);
    EXPECT(written == len);
    EXPECT(old[16] == 0xAB);
    /* Never opened, a bad id, a bad size, no engine. */
    EXPECT(qr_stream_stats_get(p->client, p->client_conn, 4000, &c) == QR_ESTREAM);
    EXPECT(qr_stream_stats_get(p->client, p->client_conn, 1ull << 62, &c) == QR_EINVAL);
    c.struct_size = 2;
    EXPECT(qr_stream_stats_get(p->client, p->client_conn, s, &c) == QR_EINVAL);
    EXPECT(qr_stream_stats_get(NULL, p->client_conn, s, &c) == QR_ENULL);
    return 0;
}

static int test_stream_echo_sha256(void) {
    enum { LEN = 4 << 20 };
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    uint64_t s;
    EXPECT(qr_stream_open(p.client, p.client_conn, 1, &s) == QR_OK);
    static uint8_t out[65536], in[65536], echo[65536];
    sha256_ctx sent, got;
    sha256_init(&sent);
    sha256_init(&got);
    size_t written = 0, chunk_off = 0, chunk_len = 0, received = 0;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int finished = 0, fin = 0, server_fin = 0;
    uint64_t ss = 0;
    size_t echo_len = 0, echo_off = 0;
    seen_calls cseen = {0, 0}, sseen = {0, 0};
    for (unsigned long long i = 0; !fin && i < QR_PAIR_MAX_SPINS; i++) {
        /* client: write */
        while (written < LEN) {
            if (chunk_off == chunk_len) {
                chunk_len = LEN - written < sizeof out ? LEN - written : sizeof out;
                for (size_t k = 0; k < chunk_len; k++) {
                    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                    out[k] = (uint8_t)x;
                }
                sha256_update(&sent, out, chunk_len);
                chunk_off = 0;
            }
            long long n = qr_stream_write(p.client, p.client_conn, s, out + chunk_off,
                                          chunk_len - chunk_off);
            if (n == QR_EAGAIN) {
                cseen.writes_blocked++;
                break;
            }
            EXPECT(n > 0);
            chunk_off += (size_t)n;
            written += (size_t)n;
        }
        if (written == LEN && !finished) {
            EXPECT(qr_stream_finish(p.client, p.client_conn, s) == QR_OK);
            finished = 1;
        }
        qr_pair_step(&p);
        for (int k = 0; k < p.nsev; k++)
            if (p.sev[k].kind == QR_EVENT_STREAM_OPENED) ss = p.sev[k].stream;
        /* server: echo */
        for (;;) {
            if (echo_off < echo_len) {
                long long w = qr_stream_write(p.server, p.server_conn, ss, echo + echo_off,
                                              echo_len - echo_off);
                if (w == QR_EAGAIN) {
                    sseen.writes_blocked++;
                    break;
                }
                EXPECT(w > 0);
                echo_off += (size_t)w;
                continue;
            }
            if (server_fin) break;
            int f = 0;
            long long n = qr_stream_read(p.server, p.server_conn, ss, echo, sizeof echo, &f);
            sseen.reads_empty += n == QR_EAGAIN;
            if (n == QR_EAGAIN || n == QR_ESTREAM) break;
            EXPECT(n >= 0);
            echo_len = (size_t)n;
            echo_off = 0;
            if (f) server_fin = 1;
        }
        if (server_fin && echo_off == echo_len && server_fin != 2) {
            EXPECT(qr_stream_finish(p.server, p.server_conn, ss) == QR_OK);
            server_fin = 2;
        }
        /* client: read the echo */
        for (;;) {
            long long n = qr_stream_read(p.client, p.client_conn, s, in, sizeof in, &fin);
            if (n == QR_EAGAIN) {
                cseen.reads_empty++;
                break;
            }
            EXPECT(n >= 0);
            sha256_update(&got, in, (size_t)n);
            received += (size_t)n;
            if (fin) break;
        }
    }
    EXPECT(fin);
    EXPECT(received == LEN);
    uint8_t a[32], b[32];
    sha256_final(&sent, a);
    sha256_final(&got, b);
    EXPECT(memcmp(a, b, 32) == 0);
    /* The stream is finished: writing again is a closed-stream error. */
    EXPECT(qr_stream_write(p.client, p.client_conn, s, out, 1) == QR_ESTREAM);
    /* ...and so is reading past the end. */
    EXPECT(qr_stream_read(p.client, p.client_conn, s, in, sizeof in, NULL) == QR_ESTREAM);
    EXPECT(check_stream_stats(&p, s, ss, LEN, cseen, sseen) == 0);
    qr_pair_free(&p);
    return 0;
}

static int test_datagrams(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    EXPECT(qr_datagram_max_size(p.client, p.client_conn) > 3000);
    uint8_t msg[100];
    for (int i = 0; i < 100; i++) msg[i] = (uint8_t)i;
    EXPECT(qr_datagram_send(p.client, p.client_conn, msg, sizeof msg) == QR_OK);
    static uint8_t huge[70000];
    EXPECT(qr_datagram_send(p.client, p.client_conn, huge, sizeof huge) == QR_ETOOLARGE);
    int got = 0;
    for (unsigned long long i = 0; !got && i < QR_PAIR_MAX_SPINS; i++) {
        qr_pair_step(&p);
        for (int k = 0; k < p.nsev; k++)
            if (p.sev[k].kind == QR_EVENT_DATAGRAM && p.sev[k].conn == p.server_conn) got = 1;
    }
    EXPECT(got);
    uint8_t small[10], buf[200];
    size_t needed = 0;
    EXPECT(qr_datagram_recv(p.server, p.server_conn, small, sizeof small, &needed) ==
           QR_ETOOSMALL);
    EXPECT(needed == 100);
    EXPECT(qr_datagram_recv(p.server, p.server_conn, buf, sizeof buf, NULL) == 100);
    EXPECT(memcmp(buf, msg, 100) == 0);
    EXPECT(qr_datagram_recv(p.server, p.server_conn, buf, sizeof buf, NULL) == QR_EAGAIN);
    qr_pair_free(&p);
    return 0;
}

static int test_error_paths(void) {
    /* Every code has a description. */
    for (int c = 0; c >= -17; c--) EXPECT(qr_strerror(c) != NULL && qr_strerror(c)[0]);
    EXPECT(strcmp(qr_strerror(QR_EAGAIN), "would block; retry after the matching event") == 0);
    EXPECT(strcmp(qr_strerror(-1000), "unknown error code") == 0);
    /* Null handles and pointers. */
    qr_event evs[4];
    qr_fabric *f = NULL;
    EXPECT(qr_engine_poll(NULL, evs, 4) == QR_ENULL);
    EXPECT(qr_fabric_new(NULL, &f) == QR_ENULL);
    EXPECT(qr_stream_write(NULL, 1, 0, (const uint8_t *)"x", 1) == QR_ENULL);
    EXPECT(qr_stream_read(NULL, 1, 0, evs[0].remote.gid, 1, NULL) == QR_ENULL);
    EXPECT(qr_datagram_send(NULL, 1, NULL, 0) == QR_ENULL);
    EXPECT(qr_close(NULL, 1, 0, NULL, 0) == QR_ENULL);
    qr_engine_free(NULL);
    qr_fabric_free(NULL);
    /* Bad configs. */
    qr_fabric_config fc;
    memset(&fc, 0, sizeof fc);
    EXPECT(qr_fabric_new(&fc, &f) == QR_EINVAL); /* struct_size 0 */
    fc.struct_size = sizeof fc;
    fc.provider = "no-such-provider";
    EXPECT(qr_fabric_new(&fc, &f) == QR_ENOPROVIDER);
    fc.provider = "sim";
    fc.mtu = 1000;
    EXPECT(qr_fabric_new(&fc, &f) == QR_EINVAL);
    fc.mtu = 1024; /* below QUIC's 1200: the engine segments (QUIC sees more) */
    EXPECT(qr_fabric_new(&fc, &f) == QR_OK);
    qr_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.struct_size = sizeof ec;
    qr_engine *e = NULL;
    EXPECT(qr_engine_new(f, &ec, &e) == QR_ENULL); /* no GID */
    ec.gid = "not a gid";
    EXPECT(qr_engine_new(f, &ec, &e) == QR_EINVAL);
    EXPECT(e == NULL);
    ec.gid = "fd00::9";
    EXPECT(qr_engine_new(f, &ec, &e) == QR_OK);
    EXPECT(qr_engine_mtu(e) >= 1200);
    qr_engine_free(e);
    qr_fabric_free(f);
    /* A soft port on an address this host does not own: a fabric error. */
    fc.provider = "soft";
    fc.mtu = 0;
    EXPECT(qr_fabric_new(&fc, &f) == QR_OK);
    e = NULL;
    ec.gid = "192.0.2.1"; /* TEST-NET-1 (RFC 5737): never local */
    EXPECT(qr_engine_new(f, &ec, &e) == QR_EFABRIC);
    EXPECT(e == NULL);
    EXPECT(strstr(qr_last_error(), "192.0.2.1") != NULL);
    qr_fabric_free(f);
    /* A live pair: unknown connection, wrong stream direction, small buffers, closed. */
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    uint64_t s;
    EXPECT(qr_stream_open(p.client, 12345, 1, &s) == QR_ENOCONN);
    EXPECT(qr_stream_open(p.client, p.client_conn, 1, NULL) == QR_ENULL);
    EXPECT(qr_stream_open(p.client, p.client_conn, 0, &s) == QR_OK);
    uint8_t b[4];
    EXPECT(qr_stream_read(p.client, p.client_conn, s, b, sizeof b, NULL) == QR_ESTREAM);
    EXPECT(qr_stream_read(p.client, p.client_conn, s, NULL, 4, NULL) == QR_ENULL);
    EXPECT(qr_stream_write(p.client, p.client_conn, 1ull << 62, b, 1) == QR_EINVAL);
    EXPECT(qr_stream_reset(p.client, p.client_conn, s, 1ull << 62) == QR_EINVAL);
    EXPECT(qr_stream_set_priority(p.client, p.client_conn, s, 7) == QR_OK);
    EXPECT(qr_accept(p.server, 999, &s) == QR_ENOINCOMING);
    EXPECT(qr_refuse(p.server, 999) == QR_ENOINCOMING);
    /* Close, then: the peer sees the application code; both ids go stale. */
    EXPECT(qr_close(p.client, p.client_conn, 77, (const uint8_t *)"bye", 3) == QR_OK);
    EXPECT(qr_stream_write(p.client, p.client_conn, s, b, 1) == QR_ECLOSED);
    int lost = 0, c_closed = 0, s_closed = 0;
    for (unsigned long long i = 0; !(c_closed && s_closed) && i < QR_PAIR_MAX_SPINS; i++) {
        /* A one-entry array: events that do not fit wait for the next call. */
        qr_event one;
        int n;
        while ((n = qr_engine_poll(p.server, &one, 1)) == 1) {
            if (one.kind == QR_EVENT_CONNECTION_LOST) {
                EXPECT(one.reason == QR_CLOSE_APPLICATION && one.code == 77);
                lost = 1;
            }
            if (one.kind == QR_EVENT_CLOSED) s_closed = 1;
        }
        EXPECT(n == 0);
        while ((n = qr_engine_poll(p.client, &one, 1)) == 1)
            if (one.kind == QR_EVENT_CLOSED) c_closed = 1;
    }
    EXPECT(lost && c_closed && s_closed);
    EXPECT(qr_stream_write(p.client, p.client_conn, s, b, 1) == QR_ENOCONN);
    qr_pair_free(&p);
    return 0;
}


/* Issue 14 #1: a stream id nobody opened is refused (QR_ESTREAM) by every call,
 * and no frame goes out for it: the connection stays up and a real stream works. */
static int test_unopened_stream_ids(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    const uint8_t x = 'x';
    /* 4: the client's second bidi stream (never opened); 1: the server's first. */
    uint64_t ids[] = {4, 1, 8, 2};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        EXPECT(qr_stream_write(p.client, p.client_conn, ids[i], &x, 1) == QR_ESTREAM);
        EXPECT(qr_stream_finish(p.client, p.client_conn, ids[i]) == QR_ESTREAM);
        EXPECT(qr_stream_reset(p.client, p.client_conn, ids[i], 3) == QR_ESTREAM);
        EXPECT(qr_stream_stop(p.client, p.client_conn, ids[i], 3) == QR_ESTREAM);
    }
    uint64_t s;
    EXPECT(qr_stream_open(p.client, p.client_conn, 1, &s) == QR_OK);
    EXPECT(s == 0);
    EXPECT(qr_stream_write(p.client, p.client_conn, s, &x, 1) == 1);
    EXPECT(qr_stream_finish(p.client, p.client_conn, s) == QR_OK);
    int opened = 0, lost = 0;
    for (int i = 0; i < 2000 && !opened; i++) {
        qr_pair_step(&p);
        for (int k = 0; k < p.nsev; k++) {
            if (p.sev[k].kind == QR_EVENT_STREAM_OPENED) opened = 1;
            if (p.sev[k].kind == QR_EVENT_CONNECTION_LOST) lost = 1;
        }
        for (int k = 0; k < p.ncev; k++)
            if (p.cev[k].kind == QR_EVENT_CONNECTION_LOST) lost = 1;
    }
    EXPECT(opened && !lost);
    /* The peer's stream, once it exists, is fine to stop. */
    uint64_t t;
    EXPECT(qr_stream_open(p.client, p.client_conn, 1, &t) == QR_OK);
    /* Zero bytes: a no-op that returns 0 (the header says so). */
    EXPECT(qr_stream_write(p.client, p.client_conn, t, &x, 0) == 0);
    qr_pair_free(&p);
    return 0;
}

/* Issue 14 #2: the size-then-call protocol always works, and a NULL-buffer
 * size query is a size query, not QR_ENULL. */
static int test_selfsigned_size_query(void) {
    for (int i = 0; i < 20; i++) {
        size_t cl = 0, kl = 0;
        EXPECT(qr_tls_selfsigned("size.test", NULL, 0, &cl, NULL, 0, &kl) == QR_ETOOSMALL);
        EXPECT(cl > 0 && kl > 0);
        uint8_t *c = malloc(cl), *k = malloc(kl);
        size_t cl2 = 0, kl2 = 0;
        EXPECT(qr_tls_selfsigned("size.test", c, cl, &cl2, k, kl, &kl2) == QR_OK);
        EXPECT(cl2 == cl && kl2 == kl);
        free(c);
        free(k);
    }
    size_t cl = 0, kl = 0;
    EXPECT(qr_tls_selfsigned("size.test", NULL, 1, &cl, NULL, 0, &kl) == QR_ENULL);
    return 0;
}

/* Issue 14 #3: polling with no room for events still does the I/O; nothing
 * is lost, and the events come out in order once there is room. */
static int test_poll_without_room_does_io(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    uint64_t s;
    EXPECT(qr_stream_open(p.client, p.client_conn, 1, &s) == QR_OK);
    static uint8_t data[200000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 31);
    size_t off = 0;
    qr_socket_stats before, after;
    memset(&before, 0, sizeof before);
    before.struct_size = sizeof before;
    after = before;
    /* Half the data, polled with no room until the server has events pending. */
    int pending = 0;
    for (int i = 0; i < 20000 && (off < sizeof data / 2 || !pending); i++) {
        long long n = qr_stream_write(p.client, p.client_conn, s, data + off,
                                      sizeof data / 2 - off);
        if (n > 0) off += (size_t)n;
        EXPECT(qr_engine_poll(p.client, NULL, 0) == 0);
        EXPECT(qr_engine_poll(p.server, NULL, 0) == 0);
        pending = qr_engine_flush(p.server, 0) > 0;
    }
    EXPECT(off == sizeof data / 2 && pending);
    EXPECT(qr_socket_stats_get(p.server, &before) == QR_OK);
    /* The rest, still with no room: the server must go on receiving. */
    for (int i = 0; i < 20000 && off < sizeof data; i++) {
        long long n = qr_stream_write(p.client, p.client_conn, s, data + off, sizeof data - off);
        if (n > 0) off += (size_t)n;
        EXPECT(qr_engine_poll(p.client, NULL, 0) == 0);
        EXPECT(qr_engine_poll(p.server, NULL, 0) == 0);
    }
    for (int i = 0; i < 100; i++) {
        EXPECT(qr_engine_poll(p.client, NULL, 0) == 0);
        EXPECT(qr_engine_flush(p.server, 0) > 0);
    }
    EXPECT(off == sizeof data);
    EXPECT(qr_socket_stats_get(p.server, &after) == QR_OK);
    EXPECT(after.recv_packets > before.recv_packets);
    /* Everything is still there, oldest first: the stream opened first. */
    qr_event ev[QR_PAIR_EVENTS];
    int n = qr_engine_poll(p.server, ev, QR_PAIR_EVENTS);
    EXPECT(n > 0);
    int opened_at = -1, readable_at = -1;
    for (int k = n - 1; k >= 0; k--) {
        if (ev[k].kind == QR_EVENT_STREAM_OPENED && ev[k].stream == s) opened_at = k;
        if (ev[k].kind == QR_EVENT_STREAM_READABLE && ev[k].stream == s) readable_at = k;
    }
    EXPECT(opened_at >= 0 && readable_at > opened_at);
    static uint8_t got[200000];
    size_t have = 0;
    for (int i = 0; i < 20000 && have < sizeof got; i++) {
        int fin = 0;
        long long r = qr_stream_read(p.server, p.server_conn, s, got + have, sizeof got - have, &fin);
        if (r > 0) have += (size_t)r;
        qr_pair_step(&p);
    }
    EXPECT(have == sizeof data && memcmp(got, data, sizeof data) == 0);
    qr_pair_free(&p);
    return 0;
}

/* Issue 14 #4: a full datagram send queue says QR_EAGAIN (nothing dropped
 * silently); every datagram accepted arrives, in order; DATAGRAMS_WRITABLE
 * says when to go on. */
static int test_datagram_backpressure(void) {
    enum { N = 3000, LEN = 1000 };
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    static uint8_t msg[LEN], buf[LEN + 16];
    int sent = 0, recvd = 0, eagain = 0, writable = 0, blocked = 0;
    for (unsigned long long i = 0; recvd < N && i < QR_PAIR_MAX_SPINS; i++) {
        while (sent < N && !blocked) {
            memset(msg, 0, sizeof msg);
            memcpy(msg, &sent, sizeof sent);
            int rc = qr_datagram_send(p.client, p.client_conn, msg, sizeof msg);
            if (rc == QR_EAGAIN) {
                eagain++;
                blocked = 1;
                break;
            }
            EXPECT(rc == QR_OK);
            sent++;
        }
        qr_pair_step(&p);
        for (int k = 0; k < p.ncev; k++)
            if (p.cev[k].kind == QR_EVENT_DATAGRAMS_WRITABLE) {
                writable++;
                blocked = 0;
            }
        long long r;
        while ((r = qr_datagram_recv(p.server, p.server_conn, buf, sizeof buf, NULL)) > 0) {
            int seq;
            EXPECT(r == LEN);
            memcpy(&seq, buf, sizeof seq);
            EXPECT(seq == recvd);
            recvd++;
        }
    }
    EXPECT(eagain > 0 && writable > 0);
    EXPECT(sent == N && recvd == N);
    qr_pair_free(&p);
    return 0;
}

/* Issue 14 #5: a connection id of one engine names nothing in another. */
static int test_conn_ids_are_per_engine(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    EXPECT(p.client_conn != p.server_conn);
    uint64_t s;
    EXPECT(qr_stream_open(p.server, p.client_conn, 1, &s) == QR_ENOCONN);
    EXPECT(qr_stream_open(p.client, p.server_conn, 1, &s) == QR_ENOCONN);
    qr_conn_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    EXPECT(qr_conn_stats_get(p.server, p.client_conn, &st) == QR_ENOCONN);
    qr_pair_free(&p);
    return 0;
}

/* Issue 14 #6: configs are checked, never silently defaulted or masked. */
static int test_config_contract(void) {
    qr_fabric_config fc;
    memset(&fc, 0, sizeof fc);
    fc.struct_size = 4;
    qr_fabric *f = NULL;
    EXPECT(qr_fabric_new(&fc, &f) == QR_EINVAL); /* only struct_size: not a config */
    fc.struct_size = sizeof fc;
    fc.provider = "sim";
    EXPECT(qr_fabric_new(&fc, &f) == QR_OK);
    static uint8_t cert[8192], key[8192];
    size_t cl = 0, kl = 0;
    EXPECT(qr_tls_selfsigned("localhost", cert, sizeof cert, &cl, key, sizeof key, &kl) == QR_OK);
    qr_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.struct_size = 4;
    ec.gid = "fd00::31";
    qr_engine *e = NULL;
    EXPECT(qr_engine_new(f, &ec, &e) == QR_EINVAL);
    ec.struct_size = sizeof ec;
    ec.retry_policy = 3; /* none of QR_RETRY_* */
    EXPECT(qr_engine_new(f, &ec, &e) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "QR_RETRY_AUTO") != NULL);
    ec.retry_policy = QR_RETRY_AUTO;
    ec.routing_key = 1u << 20;
    EXPECT(qr_engine_new(f, &ec, &e) == QR_EINVAL);
    ec.routing_key = (1u << 20) - 1;
    ec.cert_der = cert;
    ec.cert_der_len = cl;
    ec.key_der = key;
    ec.key_der_len = kl;
    EXPECT(qr_engine_new(f, &ec, &e) == QR_OK);
    qr_engine_free(e);
    qr_fabric_free(f);
    return 0;
}

/* Caller-owned time and a grown qr_event: a handshake driven by poll_at on a
 * clock of the caller's (1 ms per step), events of a larger size with the
 * unknown tail zeroed, and deadlines on the caller's timeline. */
static int test_poll_at_caller_time(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    struct big_event { qr_event e; uint64_t later_field; };
    struct big_event ev[16];
    memset(ev, 0xee, sizeof ev);
    qr_addr server;
    EXPECT(qr_engine_local_addr(p.server, &server) == QR_OK);
    EXPECT(qr_connect(p.client, &server, "localhost", &p.client_conn) == QR_OK);
    uint64_t now = 5000000000ull; /* the caller's clock: 5 s */
    int connected = 0;
    EXPECT(qr_engine_poll_at(p.client, now, (qr_event *)ev, 16, 16) == QR_EINVAL);
    for (int i = 0; i < 5000 && !connected; i++) {
        now += 1000000;
        int n = qr_engine_poll_at(p.client, now, (qr_event *)ev, 16, sizeof ev[0]);
        EXPECT(n >= 0);
        for (int k = 0; k < n; k++) {
            EXPECT(ev[k].later_field == 0);
            if (ev[k].e.kind == QR_EVENT_CONNECTED) connected = 1;
        }
        qr_event sev[16];
        EXPECT(qr_engine_poll_at(p.server, now, sev, 16, sizeof sev[0]) >= 0);
    }
    EXPECT(connected);
    long long d = qr_engine_deadline_ns(p.client, now);
    EXPECT(d == -1 || (uint64_t)d >= now);
    EXPECT(qr_engine_readiness_fd(p.client) == QR_ENOFD); /* sim: no descriptor */
    EXPECT(qr_engine_arm(p.client) >= 0);
    qr_pair_free(&p);
    return 0;
}


/* ---- Issue 14, build items 4 and 5: TLS as deployed, 0-RTT, what a trading
 * user expects. ---- */

/* Read a file of the PKI the Rust harness wrote (QR_TEST_PKI=dir) with the
 * library's own size-then-read helper. */
static size_t load_pki(const char *name, uint8_t *buf, size_t cap) {
    const char *dir = getenv("QR_TEST_PKI");
    if (!dir) {
        fprintf(stderr, "QR_TEST_PKI is not set (tests/c_api.rs sets it)\n");
        return 0;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len = 0;
    if (qr_tls_load_file(path, NULL, 0, &len) != QR_ETOOSMALL || len > cap) return 0;
    if (qr_tls_load_file(path, buf, cap, &len) != QR_OK) return 0;
    return len;
}

typedef struct tls_files {
    const uint8_t *cert; size_t cert_len;
    const uint8_t *key; size_t key_len;
    const uint8_t *ca; size_t ca_len;
} tls_files;

static qr_engine *engine_v2(qr_fabric *f, const char *gid, uint32_t rk, tls_files t,
                            uint32_t require_client_cert, uint32_t accept_0rtt, const char *alpn) {
    qr_engine_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.gid = gid;
    c.routing_key = rk;
    c.cert_der = t.cert; c.cert_der_len = t.cert_len;
    c.key_der = t.key; c.key_der_len = t.key_len;
    c.ca_der = t.ca; c.ca_der_len = t.ca_len;
    c.require_client_cert = require_client_cert;
    c.accept_0rtt = accept_0rtt;
    c.alpn = alpn;
    qr_engine *e = NULL;
    int rc = qr_engine_new(f, &c, &e);
    if (rc != QR_OK) fprintf(stderr, "qr_engine_new: %s: %s\n", qr_strerror(rc), qr_last_error());
    return e;
}

/* Poll both until both sides report CONNECTED (1; a TLS 1.3 client may report
 * it before the server has checked the client's certificate) or the client
 * loses the connection (0). The server's id goes to *server_conn. */
static int drive_connect(qr_engine *client, qr_engine *server, uint64_t conn, uint64_t *server_conn) {
    qr_event ev[32];
    int client_ok = 0;
    *server_conn = 0;
    for (long i = 0; i < 2000000; i++) {
        int n = qr_engine_poll(client, ev, 32);
        if (n < 0) return 0;
        for (int k = 0; k < n; k++) {
            if (ev[k].conn != conn) continue;
            if (ev[k].kind == QR_EVENT_CONNECTED) client_ok = 1;
            if (ev[k].kind == QR_EVENT_CONNECTION_LOST) return 0;
        }
        n = qr_engine_poll(server, ev, 32);
        for (int k = 0; k < n; k++)
            if (ev[k].kind == QR_EVENT_CONNECTED) *server_conn = ev[k].conn;
        if (client_ok && *server_conn) {
            /* A few more rounds: the server's session tickets reach the client. */
            for (int j = 0; j < 200; j++) {
                qr_engine_poll(client, NULL, 0);
                qr_engine_poll(server, NULL, 0);
            }
            return 1;
        }
    }
    return 0;
}

/* PEM chains (leaf + intermediate, trusted through the root only), mutual
 * TLS and ALPN: a client with a certificate from the CA connects; one
 * without a certificate, one with a certificate of a foreign CA, and one
 * with another ALPN are refused. DER and PEM both load. */
static int test_mtls_pem_chains_alpn(void) {
    static uint8_t chain[16384], skey[8192], root[8192], ccert[8192], ckey[8192], fcert[8192],
        fkey[8192];
    size_t chain_len = load_pki("server-chain.pem", chain, sizeof chain);
    size_t skey_len = load_pki("server-key.pem", skey, sizeof skey);
    size_t root_len = load_pki("root.pem", root, sizeof root);
    size_t ccert_len = load_pki("client.der", ccert, sizeof ccert);
    size_t ckey_len = load_pki("client-key.der", ckey, sizeof ckey);
    size_t fcert_len = load_pki("foreign.pem", fcert, sizeof fcert);
    size_t fkey_len = load_pki("foreign-key.pem", fkey, sizeof fkey);
    EXPECT(chain_len && skey_len && root_len && ccert_len && ckey_len && fcert_len && fkey_len);
    uint64_t len = 0;
    EXPECT(qr_tls_load_file("/nonexistent/qr.pem", NULL, 0, (size_t *)&len) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "/nonexistent/qr.pem") != NULL);

    qr_fabric_config fc;
    memset(&fc, 0, sizeof fc);
    fc.struct_size = sizeof fc;
    qr_fabric *f = NULL;
    EXPECT(qr_fabric_new(&fc, &f) == QR_OK);
    tls_files st = {chain, chain_len, skey, skey_len, root, root_len};
    qr_engine *server = engine_v2(f, "fd00::41", 0x41, st, 1, 0, "qr-test/1,qr-test/0");
    EXPECT(server != NULL);
    qr_addr sa;
    EXPECT(qr_engine_local_addr(server, &sa) == QR_OK);

    struct { tls_files t; const char *alpn; int ok; const char *what; } cases[] = {
        {{ccert, ccert_len, ckey, ckey_len, root, root_len}, "qr-test/1", 1, "CA client (DER)"},
        {{NULL, 0, NULL, 0, root, root_len}, "qr-test/1", 0, "no client certificate"},
        {{fcert, fcert_len, fkey, fkey_len, root, root_len}, "qr-test/1", 0, "foreign CA"},
        {{ccert, ccert_len, ckey, ckey_len, root, root_len}, "other/1", 0, "no common ALPN"},
    };
    for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char gid[32];
        snprintf(gid, sizeof gid, "fd00::5%u", i);
        qr_engine *client = engine_v2(f, gid, 0x50 + i, cases[i].t, 0, 0, cases[i].alpn);
        EXPECT(client != NULL);
        uint64_t conn, sconn;
        EXPECT(qr_connect(client, &sa, "server.test", &conn) == QR_OK);
        int ok = drive_connect(client, server, conn, &sconn);
        if (ok != cases[i].ok) fprintf(stderr, "case %s: connected=%d\n", cases[i].what, ok);
        EXPECT(ok == cases[i].ok);
        if (!ok) {
            char why[256];
            size_t need = 0;
            int n = qr_conn_close_reason(client, conn, (uint8_t *)why, sizeof why - 1, &need);
            EXPECT(n > 0 && (size_t)n == need);
        }
        qr_engine_free(client);
    }
    /* A key that is not the certificate's is refused with a hint. */
    tls_files bad = {chain, chain_len, fkey, fkey_len, NULL, 0};
    qr_engine_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.gid = "fd00::5f";
    c.cert_der = bad.cert; c.cert_der_len = bad.cert_len;
    c.key_der = bad.key; c.key_der_len = bad.key_len;
    qr_engine *e = NULL;
    EXPECT(qr_engine_new(f, &c, &e) == QR_ETLS);
    EXPECT(strstr(qr_last_error(), "key") != NULL);
    qr_engine_free(server);
    qr_fabric_free(f);
    return 0;
}

/* Transport settings from C, on the caller's clock: idle timeout 40 ms and
 * no keep-alives time the connection out 40 ms after the last packet; bad
 * settings are refused with a reason. A version-1-sized config still works. */
static int test_transport_settings(void) {
    qr_fabric_config fc;
    memset(&fc, 0, sizeof fc);
    fc.struct_size = sizeof fc;
    qr_fabric *f = NULL;
    EXPECT(qr_fabric_new(&fc, &f) == QR_OK);
    static uint8_t cert[8192], key[8192];
    size_t cl = 0, kl = 0;
    EXPECT(qr_tls_selfsigned("localhost", cert, sizeof cert, &cl, key, sizeof key, &kl) == QR_OK);
    qr_engine_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.gid = "fd00::61";
    c.cert_der = cert; c.cert_der_len = cl;
    c.key_der = key; c.key_der_len = kl;
    c.idle_timeout_ms = 40;
    c.keep_alive_ms = QR_TIMER_OFF;
    c.congestion = QR_CC_NEWRENO;
    c.stream_window = 1 << 20;
    c.conn_window = 8 << 20;
    c.recv_batch = 64;
    c.recv_depth = 1024;
    c.send_slots = 256;
    c.max_bidi_streams = 8;
    qr_engine *server = NULL, *client = NULL, *bad = NULL;
    EXPECT(qr_engine_new(f, &c, &server) == QR_OK);
    c.keep_alive_ms = 100; /* not below the idle timeout */
    EXPECT(qr_engine_new(f, &c, &bad) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "keep-alive") != NULL);
    c.keep_alive_ms = QR_TIMER_OFF;
    c.congestion = 99;
    EXPECT(qr_engine_new(f, &c, &bad) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "QR_CC_") != NULL);
    c.congestion = QR_CC_BBR;
    c.gid = "fd00::62";
    c.cert_der = NULL; c.cert_der_len = 0;
    c.key_der = NULL; c.key_der_len = 0;
    c.ca_der = cert; c.ca_der_len = cl;
    EXPECT(qr_engine_new(f, &c, &client) == QR_OK);
    /* A caller built against version 1 passes the smaller size: defaults. */
    c.struct_size = offsetof(qr_engine_config, require_client_cert);
    c.gid = "fd00::63";
    c.idle_timeout_ms = 7; /* beyond the caller's size: never read */
    EXPECT(qr_engine_new(f, &c, &bad) == QR_OK);
    qr_engine_free(bad);

    qr_addr sa;
    EXPECT(qr_engine_local_addr(server, &sa) == QR_OK);
    uint64_t conn;
    EXPECT(qr_connect(client, &sa, "localhost", &conn) == QR_OK);
    uint64_t now = 1000000000ull;
    qr_event ev[16];
    int connected = 0;
    for (int i = 0; i < 2000 && !connected; i++) {
        now += 100000; /* 0.1 ms steps */
        int n = qr_engine_poll_at(client, now, ev, 16, sizeof ev[0]);
        for (int k = 0; k < n; k++) connected |= ev[k].kind == QR_EVENT_CONNECTED;
        EXPECT(qr_engine_poll_at(server, now, ev, 16, sizeof ev[0]) >= 0);
    }
    EXPECT(connected);
    /* Let the last packets land, then leave the server silent. */
    for (int i = 0; i < 20; i++) {
        now += 100000;
        qr_engine_poll_at(client, now, ev, 16, sizeof ev[0]);
        qr_engine_poll_at(server, now, ev, 16, sizeof ev[0]);
    }
    uint64_t quiet = now;
    int lost = 0;
    while (!lost && now < quiet + 200000000ull) {
        now += 1000000; /* 1 ms steps; the server is not polled */
        int n = qr_engine_poll_at(client, now, ev, 16, sizeof ev[0]);
        for (int k = 0; k < n; k++)
            if (ev[k].kind == QR_EVENT_CONNECTION_LOST && ev[k].reason == QR_CLOSE_TIMED_OUT) lost = 1;
    }
    EXPECT(lost);
    /* RFC 9000 §10.1: the idle timeout, and the 3×PTO floor, are well under 100 ms here. */
    EXPECT(now - quiet >= 40000000ull && now - quiet <= 100000000ull);
    qr_engine_free(client);
    qr_engine_free(server);
    qr_fabric_free(f);
    return 0;
}

/* A user pointer rides on every event of its connection through
 * QR_EVENT_CLOSED; event times are the caller's; the peer's address and the
 * reason phrase of its CONNECTION_CLOSE are readable. */
static int test_user_context_and_close_reason(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    static int ctx;
    void *got = (void *)1;
    EXPECT(qr_conn_user(p.client, p.client_conn, &got) == QR_OK && got == NULL);
    EXPECT(qr_conn_set_user(p.client, p.client_conn, &ctx) == QR_OK);
    EXPECT(qr_conn_user(p.client, p.client_conn, &got) == QR_OK && got == &ctx);
    EXPECT(qr_conn_set_user(p.client, p.server_conn, &ctx) == QR_ENOCONN);
    qr_addr sa, remote;
    EXPECT(qr_engine_local_addr(p.server, &sa) == QR_OK);
    EXPECT(qr_conn_remote(p.client, p.client_conn, &remote) == QR_OK);
    EXPECT(memcmp(&sa, &remote, sizeof sa) == 0);
    size_t need = 7;
    EXPECT(qr_conn_close_reason(p.client, p.client_conn, NULL, 0, &need) == 0 && need == 0);

    static const char bye[] = "end of session";
    EXPECT(qr_close(p.server, p.server_conn, 42, (const uint8_t *)bye, strlen(bye)) == QR_OK);
    uint64_t now = 9000000000ull;
    int lost = 0, closed = 0;
    for (int i = 0; i < 100000 && !closed; i++) {
        now += 1000000;
        qr_event ev[16];
        int n = qr_engine_poll_at(p.client, now, ev, 16, sizeof ev[0]);
        EXPECT(n >= 0);
        for (int k = 0; k < n; k++) {
            EXPECT(ev[k].time_ns == now);
            if (ev[k].conn != p.client_conn) continue;
            EXPECT(ev[k].user == &ctx);
            if (ev[k].kind == QR_EVENT_CONNECTION_LOST) {
                EXPECT(ev[k].reason == QR_CLOSE_APPLICATION && ev[k].code == 42);
                char why[64];
                int m = qr_conn_close_reason(p.client, p.client_conn, (uint8_t *)why, 3, &need);
                EXPECT(m == QR_ETOOSMALL && need == strlen(bye));
                m = qr_conn_close_reason(p.client, p.client_conn, (uint8_t *)why, sizeof why, &need);
                EXPECT(m == (int)strlen(bye) && memcmp(why, bye, strlen(bye)) == 0);
                lost = 1;
            }
            if (ev[k].kind == QR_EVENT_CLOSED) closed = 1;
        }
        qr_engine_poll_at(p.server, now, NULL, 0, sizeof(qr_event));
    }
    EXPECT(lost && closed);
    qr_pair_free(&p);
    return 0;
}

/* 0-RTT (RFC 9001 §4.6): the second connection to a server that accepts early
 * data opens a stream and writes before any packet is exchanged; the server
 * reads it, the client sees QR_0RTT_ACCEPTED and CONNECTED with code 1. A
 * server without accept_0rtt takes the same bytes after the handshake. */
static int test_zero_rtt_resumption(void) {
    for (int accept = 1; accept >= 0; accept--) {
        qr_fabric_config fc;
        memset(&fc, 0, sizeof fc);
        fc.struct_size = sizeof fc;
        qr_fabric *f = NULL;
        EXPECT(qr_fabric_new(&fc, &f) == QR_OK);
        static uint8_t cert[8192], key[8192];
        size_t cl = 0, kl = 0;
        EXPECT(qr_tls_selfsigned("localhost", cert, sizeof cert, &cl, key, sizeof key, &kl) == QR_OK);
        tls_files st = {cert, cl, key, kl, NULL, 0}, ct = {NULL, 0, NULL, 0, cert, cl};
        qr_engine *server = engine_v2(f, "fd00::71", 0x71, st, 0, (uint32_t)accept, "qr/1");
        qr_engine *client = engine_v2(f, "fd00::72", 0x72, ct, 0, 0, "qr/1");
        EXPECT(server && client);
        qr_addr sa;
        EXPECT(qr_engine_local_addr(server, &sa) == QR_OK);
        uint64_t conn, sconn;
        EXPECT(qr_connect(client, &sa, "localhost", &conn) == QR_OK);
        EXPECT(qr_conn_0rtt(client, conn) == 0); /* nothing to resume yet */
        EXPECT(drive_connect(client, server, conn, &sconn) == 1);
        EXPECT(qr_close(client, conn, 0, NULL, 0) == QR_OK);
        for (int i = 0; i < 2000; i++) {
            qr_engine_poll(client, NULL, 0);
            qr_engine_poll(server, NULL, 0);
        }

        EXPECT(qr_connect(client, &sa, "localhost", &conn) == QR_OK);
        int z = qr_conn_0rtt(client, conn);
        EXPECT(accept ? z == QR_0RTT_POSSIBLE : z == 0);
        uint64_t s = 0;
        static const char early[] = "early bird";
        if (accept) {
            /* Before any packet: the stream and its bytes ride the first flight. */
            EXPECT(qr_stream_open(client, conn, 1, &s) == QR_OK);
            EXPECT(qr_stream_write(client, conn, s, (const uint8_t *)early, strlen(early)) ==
                   (int64_t)strlen(early));
            EXPECT(qr_stream_finish(client, conn, s) == QR_OK);
        }
        int connected = 0, got = 0;
        uint64_t connected_code = 9;
        char buf[64];
        size_t have = 0;
        for (long i = 0; i < 2000000 && !(connected && got); i++) {
            qr_event ev[32];
            int n = qr_engine_poll_at(client, 0, ev, 32, sizeof ev[0]);
            for (int k = 0; k < n; k++)
                if (ev[k].kind == QR_EVENT_CONNECTED && ev[k].conn == conn) {
                    connected = 1;
                    connected_code = ev[k].code;
                    if (!accept) {
                        EXPECT(qr_stream_open(client, conn, 1, &s) == QR_OK);
                        EXPECT(qr_stream_write(client, conn, s, (const uint8_t *)early,
                                               strlen(early)) == (int64_t)strlen(early));
                        EXPECT(qr_stream_finish(client, conn, s) == QR_OK);
                    }
                }
            n = qr_engine_poll(server, ev, 32);
            for (int k = 0; k < n; k++) {
                if (ev[k].kind != QR_EVENT_STREAM_READABLE && ev[k].kind != QR_EVENT_STREAM_OPENED)
                    continue;
                int fin = 0;
                int64_t r = qr_stream_read(server, ev[k].conn, ev[k].stream, (uint8_t *)buf + have,
                                           sizeof buf - have, &fin);
                if (r > 0) have += (size_t)r;
                if (fin) got = 1;
            }
        }
        if (!(connected && got)) fprintf(stderr, "accept=%d connected=%d got=%d have=%zu\n", accept, connected, got, have);
        EXPECT(connected && got);
        EXPECT(have == strlen(early) && memcmp(buf, early, have) == 0);
        EXPECT(connected_code == (uint64_t)accept);
        EXPECT(qr_conn_0rtt(client, conn) == (accept ? QR_0RTT_POSSIBLE | QR_0RTT_ACCEPTED : 0));
        qr_engine_free(client);
        qr_engine_free(server);
        qr_fabric_free(f);
    }
    return 0;
}

/* The address-exchange service: a client learns the server's UD address
 * from IP:PORT and connects with it; nobody listening is QR_ECONNECT with a
 * reason. The verbs provider is either built in (then, with no RDMA device
 * here, an engine on it is QR_ENODEVICE naming the fix) or QR_ENOPROVIDER
 * naming the build flag. */
static int test_bootstrap_and_verbs(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    qr_bootstrap *b = NULL;
    EXPECT(qr_bootstrap_serve(p.server, "127.0.114.1:19362", &b) == QR_OK);
    qr_bootstrap *b2 = NULL;
    EXPECT(qr_bootstrap_serve(p.server, "127.0.114.1:19362", &b2) == QR_EFABRIC);
    qr_addr got, want;
    EXPECT(qr_bootstrap_query("127.0.114.1:19362", 5000, &got) == QR_OK);
    EXPECT(qr_engine_local_addr(p.server, &want) == QR_OK);
    EXPECT(memcmp(&got, &want, sizeof got) == 0);
    EXPECT(qr_connect(p.client, &got, "localhost", &p.client_conn) == QR_OK);
    qr_bootstrap_free(b);
    EXPECT(qr_bootstrap_query("127.0.114.1:19363", 2000, &got) == QR_ECONNECT);
    EXPECT(strstr(qr_last_error(), "127.0.114.1:19363") != NULL);
    qr_pair_free(&p);

    qr_fabric_config fc;
    memset(&fc, 0, sizeof fc);
    fc.struct_size = sizeof fc;
    fc.provider = "verbs";
    qr_fabric *f = NULL;
    int rc = qr_fabric_new(&fc, &f);
    if (rc == QR_ENOPROVIDER) {
        EXPECT(strstr(qr_last_error(), "--features verbs") != NULL);
    } else {
        EXPECT(rc == QR_OK);
        qr_engine_config c;
        memset(&c, 0, sizeof c);
        c.struct_size = sizeof c;
        c.gid = "127.0.0.1";
        qr_engine *e = NULL;
        EXPECT(qr_engine_new(f, &c, &e) == QR_ENODEVICE);
        EXPECT(strstr(qr_last_error(), "soft") != NULL);
        qr_fabric_free(f);
    }
    return 0;
}

static int released_calls;
static const uint8_t *released_data;
static void on_release(void *user, const uint8_t *data, size_t len) {
    (void)len;
    if (user == &released_calls) released_calls++;
    released_data = data;
}

/* A lent buffer (qr_stream_write_zc) arrives intact and is released exactly
 * once after the peer acknowledged it; a refused call releases at once. A key
 * update on demand keeps the connection working. */
static int test_zero_copy_write_and_key_update(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    qr_addr sa;
    EXPECT(qr_engine_local_addr(p.server, &sa) == QR_OK);
    uint64_t early;
    EXPECT(qr_connect(p.client, &sa, "localhost", &early) == QR_OK);
    EXPECT(qr_conn_key_update(p.client, early) == QR_EINVAL); /* not yet confirmed */
    EXPECT(qr_close(p.client, early, 0, NULL, 0) == QR_OK);
    EXPECT(qr_pair_connect(&p) == 0);
    static uint8_t lent[100000];
    for (size_t i = 0; i < sizeof lent; i++) lent[i] = (uint8_t)(i * 7 + 3);
    uint64_t s;
    EXPECT(qr_stream_open(p.client, p.client_conn, 1, &s) == QR_OK);
    EXPECT(qr_stream_write_zc(p.client, p.client_conn, s + 4, lent, 10, on_release, &released_calls) ==
           QR_ESTREAM);
    EXPECT(released_calls == 1 && released_data == lent); /* refused: released at once */
    released_calls = 0;
    size_t off = 0, got = 0;
    int calls = 0, fin = 0;
    static uint8_t in[100001]; /* room to see the FIN after the last byte */
    EXPECT(qr_conn_key_update(p.client, p.client_conn) == QR_OK);
    for (long i = 0; i < 2000000 && !(fin && released_calls == calls); i++) {
        if (off < sizeof lent) {
            int64_t n = qr_stream_write_zc(p.client, p.client_conn, s, lent + off, sizeof lent - off,
                                           on_release, &released_calls);
            if (n > 0) {
                off += (size_t)n;
                calls++;
                if (off == sizeof lent) EXPECT(qr_stream_finish(p.client, p.client_conn, s) == QR_OK);
            } else {
                EXPECT(n == QR_EAGAIN);
                calls++; /* released before it returned */
            }
        }
        qr_pair_step(&p);
        if (!fin) {
            int32_t f = 0;
            int64_t n = qr_stream_read(p.server, p.server_conn, s, in + got, sizeof in - got, &f);
            if (n > 0) got += (size_t)n;
            fin = f;
        }
    }
    EXPECT(fin && got == sizeof lent && memcmp(in, lent, sizeof lent) == 0);
    EXPECT(released_calls == calls);
    qr_pair_free(&p);
    return 0;
}

static int log_lines, log_bad;
static void on_log(void *user, int32_t level, const char *target, const char *message) {
    if (user != &log_lines || level < QR_LOG_ERROR || level > QR_LOG_TRACE || !target || !message)
        log_bad++;
    log_lines++;
}

/* The log hook, the version, the panic policy, pinning. */
static int test_log_version_policy_pinning(void) {
    EXPECT(qr_log_set(on_log, &log_lines, QR_LOG_TRACE) == QR_OK);
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    EXPECT(qr_log_set(NULL, NULL, QR_LOG_OFF) == QR_OK);
    int seen = log_lines;
    EXPECT(seen > 0 && log_bad == 0);
    qr_pair_free(&p);
    EXPECT(log_lines == seen); /* off means off */
    EXPECT(qr_log_set(on_log, &log_lines, 17) == QR_EINVAL);

    unsigned v = qr_version_number();
    char text[32];
    snprintf(text, sizeof text, "%u.%u.%u", v >> 16, (v >> 8) & 0xff, v & 0xff);
    EXPECT(strcmp(text, qr_version()) == 0);
    EXPECT(qr_set_panic_policy(QR_PANIC_ABORT) == QR_PANIC_RETURN);
    EXPECT(qr_set_panic_policy(QR_PANIC_RETURN) == QR_PANIC_ABORT);
    EXPECT(qr_set_panic_policy(5) == QR_EINVAL);
    EXPECT(qr_pin_thread(0) == QR_OK);
    EXPECT(qr_pin_thread(1u << 30) == QR_EINVAL);
    EXPECT(strstr(qr_last_error(), "cpu") != NULL);
    return 0;
}

/* ---- Issue 13: qr_engine_wait, the spin-then-sleep driver. ---- */

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

typedef struct sleeper {
    qr_engine *e;
    uint8_t got[64];
    long long n;
    int woken, rc;
} sleeper;

/* The server on its own thread: poll, read what came, and wait (sleep) in
 * between, until the client's 64 bytes are in. */
static void *serve_sleeping(void *arg) {
    sleeper *s = arg;
    uint64_t until = mono_ns() + 10000000000ull;
    while (s->n < 64 && mono_ns() < until) {
        qr_event ev[16];
        int k = qr_engine_poll(s->e, ev, 16);
        if (k < 0) { s->rc = k; return NULL; }
        for (int i = 0; i < k; i++) {
            if (ev[i].kind != QR_EVENT_STREAM_READABLE) continue;
            int fin = 0;
            long long r = qr_stream_read(s->e, ev[i].conn, ev[i].stream, s->got + s->n,
                                         sizeof s->got - (size_t)s->n, &fin);
            if (r > 0) s->n += r;
        }
        if (k == 0) {
            int w = qr_engine_wait(s->e, 0, 1000000000);
            if (w < 0) { s->rc = w; return NULL; }
            if (w == QR_WAIT_WOKEN) s->woken++;
        }
    }
    return NULL;
}

static int test_wait_sleeps_and_wakes(void) {
    qr_pair p;
    qr_pair_init(&p, "sim");
    EXPECT(qr_pair_connect(&p) == 0);
    EXPECT(qr_engine_set_idle(NULL, 0, 0) == QR_ENULL);
    EXPECT(qr_engine_set_idle(p.server, 10, 5) == QR_EINVAL);
    EXPECT(qr_engine_wait(p.server, 0, -2) == QR_EINVAL);
    EXPECT(qr_engine_set_idle(p.server, 0, 0) == QR_OK);
    /* Pure busy-poll: never sleeps, however long nothing happens. */
    EXPECT(qr_engine_set_idle(p.client, QR_SPIN_FOREVER, QR_SPIN_FOREVER) == QR_OK);
    uint64_t t0 = mono_ns();
    for (int i = 0; i < 1000; i++)
        EXPECT(qr_engine_wait(p.client, 0, 1000000000) == QR_WAIT_SPUN);
    EXPECT(mono_ns() - t0 < 900000000ull);
    /* A 1 ns budget: once the events are handed out, it sleeps to its limit
     * (or the engine's next timer, if sooner). */
    EXPECT(qr_engine_set_idle(p.server, 1, 1) == QR_OK);
    qr_event ev[16];
    while (qr_engine_poll(p.server, ev, 16) > 0) {}
    /* (A fresh waiter's first call counts the engine's earlier work as
     * activity and spins.) */
    int w = QR_WAIT_SPUN;
    for (int i = 0; i < 100 && w == QR_WAIT_SPUN; i++) {
        sleep_us(100);
        w = qr_engine_wait(p.server, 0, 20000000);
    }
    EXPECT(w == QR_WAIT_TIMEOUT);
    /* A request while the server sleeps wakes it (through the engine's
     * waker: sim has no descriptor), and nothing is lost. */
    sleeper s;
    memset(&s, 0, sizeof s);
    s.e = p.server;
    pthread_t th;
    EXPECT(pthread_create(&th, NULL, serve_sleeping, &s) == 0);
    sleep_us(50000);
    uint64_t st;
    uint8_t msg[64];
    for (int i = 0; i < 64; i++) msg[i] = (uint8_t)(i * 7 + 1);
    EXPECT(qr_stream_open(p.client, p.client_conn, 1, &st) == QR_OK);
    EXPECT(qr_stream_write(p.client, p.client_conn, st, msg, sizeof msg) == 64);
    uint64_t until = mono_ns() + 10000000000ull;
    while (__atomic_load_n(&s.n, __ATOMIC_ACQUIRE) < 64 && s.rc == 0 && mono_ns() < until) {
        EXPECT(qr_engine_poll(p.client, p.cev, QR_PAIR_EVENTS) >= 0);
        sleep_us(100);
    }
    EXPECT(pthread_join(th, NULL) == 0);
    EXPECT(s.rc == 0);
    EXPECT(s.n == 64 && memcmp(s.got, msg, 64) == 0);
    EXPECT(s.woken >= 1);
    qr_pair_free(&p);
    return 0;
}

int main(void) {
    RUN(test_sha256_known_answer);
    RUN(test_error_paths);
    RUN(test_handshake);
    RUN(test_stat_list);
    RUN(test_datagrams);
    RUN(test_stream_echo_sha256);
    RUN(test_unopened_stream_ids);
    RUN(test_selfsigned_size_query);
    RUN(test_poll_without_room_does_io);
    RUN(test_datagram_backpressure);
    RUN(test_conn_ids_are_per_engine);
    RUN(test_config_contract);
    RUN(test_poll_at_caller_time);
    RUN(test_mtls_pem_chains_alpn);
    RUN(test_transport_settings);
    RUN(test_user_context_and_close_reason);
    RUN(test_zero_rtt_resumption);
    RUN(test_log_version_policy_pinning);
    RUN(test_bootstrap_and_verbs);
    RUN(test_zero_copy_write_and_key_update);
    RUN(test_wait_sleeps_and_wakes);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
