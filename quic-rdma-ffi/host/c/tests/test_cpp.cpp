/* Tests of the C++ wrapper (quic_rdma.hpp): RAII handles, moves, exceptions
 * on setup errors, a stream echo over "sim" checked by SHA-256, and the
 * completion time stamps. Prints "N passed, M failed" like the C tests. */
#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include "quic_rdma.hpp"
#include "sha256.h"

#include "check.h"

struct pair {
    qr::fabric fabric{"sim"};
    qr::self_signed id{"localhost"};
    qr::engine server, client;
    uint64_t cconn = 0, sconn = 0;

    static qr::engine make(const qr::fabric &f, const char *gid, uint32_t rk, const qr::self_signed &id,
                           bool is_server) {
        qr::engine_config c;
        c.gid = gid;
        c.routing_key = rk;
        if (is_server) c.identity(id.cert, id.key);
        else c.roots(id.cert);
        return qr::engine(f, c);
    }
    pair()
        : server(make(fabric, "fd00::81", 0x81, id, true)),
          client(make(fabric, "fd00::82", 0x82, id, false)) {}

    bool connect() {
        cconn = client.connect(server.local_addr(), "localhost");
        qr_event ev[32];
        bool c_ok = false;
        for (long i = 0; i < 2000000 && !(c_ok && sconn); i++) {
            for (auto &e : client.poll(ev)) c_ok |= e.kind == QR_EVENT_CONNECTED && e.conn == cconn;
            for (auto &e : server.poll(ev))
                if (e.kind == QR_EVENT_CONNECTED) sconn = e.conn;
        }
        return c_ok && sconn;
    }
};

static int test_setup_errors_throw_with_reason(void) {
    qr::fabric f;
    qr::engine_config c;
    c.gid = "not-an-address";
    try {
        qr::engine e(f, c);
        return 1;
    } catch (const qr::error &e) {
        EXPECT(e.code() == QR_EINVAL);
        EXPECT(std::string(e.what()).find("not-an-address") != std::string::npos);
    }
    try {
        qr::fabric bad("no-such-provider");
        return 1;
    } catch (const qr::error &e) {
        EXPECT(e.code() == QR_ENOPROVIDER);
    }
    return 0;
}

/* 1 MiB echoed back over a bidirectional stream; SHA-256 of what came back
 * equals that of what was sent; the engines are moved mid-way (RAII). */
static int test_stream_echo_and_moves(void) {
    pair p;
    EXPECT(p.connect());
    qr::engine client = std::move(p.client); /* the moved-from handle is empty */
    EXPECT(p.client.get() == nullptr && client.get() != nullptr);
    uint64_t s = 0;
    EXPECT(client.open_stream(p.cconn, true, s) == QR_OK);
    std::vector<uint8_t> out(1 << 20), back;
    uint64_t x = 0x243f6a8885a308d3ull;
    for (auto &b : out) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b = static_cast<uint8_t>(x);
    }
    size_t written = 0;
    bool finished = false, done = false, server_fin = false;
    std::vector<uint8_t> pending;
    std::vector<uint8_t> buf(65536);
    qr_event ev[64];
    for (long i = 0; i < 20000000 && !done; i++) {
        if (written < out.size()) {
            int64_t n = client.write(p.cconn, s, std::span(out).subspan(written));
            if (n > 0) written += static_cast<size_t>(n);
        } else if (!finished) {
            EXPECT(client.finish(p.cconn, s) == QR_OK);
            finished = true;
        }
        client.poll(ev);
        p.server.poll(ev);
        /* The server echoes whatever it reads. */
        bool fin = false;
        int64_t n = p.server.read(p.sconn, s, buf, fin);
        if (n > 0) pending.insert(pending.end(), buf.begin(), buf.begin() + n);
        if (!pending.empty()) {
            int64_t w = p.server.write(p.sconn, s, pending);
            if (w > 0) pending.erase(pending.begin(), pending.begin() + w);
        }
        if (fin) server_fin = true;
        if (server_fin && pending.empty()) {
            p.server.finish(p.sconn, s);
            server_fin = false;
        }
        n = client.read(p.cconn, s, buf, fin);
        if (n > 0) back.insert(back.end(), buf.begin(), buf.begin() + n);
        done = fin;
    }
    EXPECT(done && back.size() == out.size());
    uint8_t a[32], b[32];
    sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, out.data(), out.size());
    sha256_final(&c, a);
    sha256_init(&c);
    sha256_update(&c, back.data(), back.size());
    sha256_final(&c, b);
    EXPECT(std::memcmp(a, b, 32) == 0);
    /* The wrapper's figures agree with what the loop itself moved. */
    qr_stream_stats cs, ss;
    EXPECT(client.stream_stats(p.cconn, s, cs) == QR_OK);
    EXPECT(p.server.stream_stats(p.sconn, s, ss) == QR_OK);
    EXPECT(cs.struct_size == sizeof(qr_stream_stats));
    EXPECT(cs.bytes_written == out.size() && cs.bytes_read == back.size());
    EXPECT(ss.bytes_read == out.size() && ss.bytes_written == out.size());
    EXPECT((cs.flags & QR_STREAM_FINISH_SENT) && (cs.flags & QR_STREAM_FIN_READ));
    EXPECT((ss.flags & QR_STREAM_FINISH_SENT) && (ss.flags & QR_STREAM_FIN_READ));
    EXPECT(!(cs.flags & (QR_STREAM_RESET_RECEIVED | QR_STREAM_STOP_RECEIVED)));
    EXPECT(client.stream_stats(p.cconn, s + 400, cs) == QR_ESTREAM);
    EXPECT(client.stream_stats(p.cconn + 99, s, cs) == QR_ENOCONN);
    qr_conn_stats st = client.conn_stats(p.cconn);
    EXPECT(st.struct_size == sizeof(qr_conn_stats));
    /* Every byte sent went out in packets (plus headers and the handshake). */
    EXPECT(st.tx_bytes > out.size() && st.rx_bytes > back.size());
    EXPECT(st.handshake_ns > 0 && st.min_rtt_ns > 0 && st.min_rtt_ns <= st.rtt_ns + st.rtt_var_ns * 4);
    try {
        (void)client.conn_stats(p.cconn + 99);
        EXPECT(!"conn_stats on an unknown connection must throw");
    } catch (const qr::error &e) {
        EXPECT(e.code() == QR_ENOCONN);
    }
    EXPECT(client.close(p.cconn, 7, "done") == QR_OK);
    std::string why;
    for (long i = 0; i < 200000 && why.empty(); i++) {
        client.poll(ev);
        p.server.poll(ev);
        why = p.server.close_reason(p.sconn);
    }
    EXPECT(why == "done");
    return 0;
}

/* CLOCK_MONOTONIC nanoseconds (libstdc++'s steady_clock on Linux), the
 * timeline of the stamps. */
static uint64_t mono_ns() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
}

/* Time stamps through the wrapper: off until enabled, then one per datagram
 * (on the sim fabric's clock, inside the window of its exchange, gone once
 * the datagram is read), per connection and per reaped send. */
static int test_timestamps(void) {
    pair p;
    EXPECT(p.connect());
    qr_event ev[32];
    auto await_datagram = [&]() {
        for (long i = 0; i < 2000000; i++) {
            p.client.poll(ev);
            for (auto &e : p.server.poll(ev))
                if (e.kind == QR_EVENT_DATAGRAM) return true;
        }
        return false;
    };
    uint8_t msg[64], buf[64];
    std::memset(msg, 'q', sizeof msg);
    qr::timestamp t;
    /* Off by default. */
    EXPECT(p.client.send_datagram(p.cconn, msg) == QR_OK);
    EXPECT(await_datagram());
    EXPECT(p.server.datagram_timestamp(p.sconn, t) == QR_EAGAIN);
    EXPECT(p.server.rx_timestamp(p.sconn, t) == QR_EAGAIN);
    EXPECT(p.client.send_timestamp(t) == QR_EAGAIN);
    EXPECT(p.server.recv_datagram(p.sconn, buf) == 64);
    EXPECT(p.server.enable_timestamps() == QR_CLOCK_SIM_FABRIC);
    EXPECT(p.client.enable_timestamps() == QR_CLOCK_SIM_FABRIC);
    uint64_t prev = 0;
    for (int i = 0; i < 3; i++) {
        std::memset(msg, 'a' + i, sizeof msg);
        uint64_t before = mono_ns();
        EXPECT(p.client.send_datagram(p.cconn, msg) == QR_OK);
        EXPECT(await_datagram());
        uint64_t after = mono_ns();
        qr_timestamp d;  /* not initialised: the wrapper sets struct_size */
        EXPECT(p.server.datagram_timestamp(p.sconn, d) == QR_OK);
        EXPECT(d.struct_size == sizeof(qr_timestamp) && d.clock == QR_CLOCK_SIM_FABRIC);
        EXPECT(before <= d.ns && d.ns <= after && d.ns >= prev);
        prev = d.ns;
        EXPECT(p.server.recv_datagram(p.sconn, buf) == 64);
        EXPECT(std::memcmp(buf, msg, sizeof msg) == 0);
        EXPECT(p.server.datagram_timestamp(p.sconn, d) == QR_EAGAIN);
        qr::timestamp rx;
        EXPECT(p.server.rx_timestamp(p.sconn, rx) == QR_OK);
        EXPECT(rx.clock == QR_CLOCK_SIM_FABRIC && prev <= rx.ns && rx.ns <= after);
    }
    /* Sends are signaled one in 16: push enough through that one is reaped. */
    uint64_t before = mono_ns();
    for (int i = 0; i < 64; i++) {
        EXPECT(p.client.send_datagram(p.cconn, std::span<const uint8_t>(msg, 1)) == QR_OK);
        p.client.poll(ev);
        p.server.poll(ev);
    }
    for (int i = 0; i < 1000; i++) {
        p.client.poll(ev);
        p.server.poll(ev);
    }
    uint64_t after = mono_ns();
    qr::timestamp s;
    EXPECT(p.client.send_timestamp(s) == QR_OK);
    EXPECT(s.clock == QR_CLOCK_SIM_FABRIC && before <= s.ns && s.ns <= after);
    /* A bad connection id is an error code, not an exception. */
    EXPECT(p.server.rx_timestamp(12345, s) == QR_ENOCONN);
    return 0;
}

int main() {
    RUN(test_setup_errors_throw_with_reason);
    RUN(test_stream_echo_and_moves);
    RUN(test_timestamps);
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
