/* quic-rdma: a header-only C++20 wrapper over the C API (quic_rdma.h).
 *
 * - RAII: qr::fabric and qr::engine own their handles (move-only);
 * - setup (constructors, connect) throws qr::error carrying the QR_E* code and
 *   the library's reason (qr_last_error);
 * - the data path (poll, read, write, datagrams) never throws and never
 *   allocates: it returns the C API's counts and codes, on std::span buffers
 *   of the caller's;
 * - every handle is still reachable with get() for calls not wrapped here.
 *
 * Thread safety is the C API's: an engine is used by one thread at a time;
 * fabrics may be shared by engines on different threads. */
#ifndef QUIC_RDMA_HPP
#define QUIC_RDMA_HPP

#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "quic_rdma.h"

namespace qr {

/** A failed setup call: the code (QR_E*) and the library's reason. */
class error : public std::runtime_error {
public:
    error(int code, const char *what_call)
        : std::runtime_error(std::string(what_call) + ": " + qr_strerror(code) +
                             (*qr_last_error() ? std::string(" (") + qr_last_error() + ")" : "")),
          code_(code) {}
    /** The QR_E* code. */
    int code() const noexcept { return code_; }

private:
    int code_;
};

/** Throw qr::error for a negative code; return non-negative ones. */
inline long long check(long long rc, const char *what_call) {
    if (rc < 0) throw error(static_cast<int>(rc), what_call);
    return rc;
}

/** An engine config of this header's version, zeroed with struct_size set (all defaults). */
struct engine_config : qr_engine_config {
    engine_config() : qr_engine_config{} { struct_size = sizeof(qr_engine_config); }
    /** This endpoint's certificate (chain) and key, PEM or DER. */
    engine_config &identity(std::span<const uint8_t> cert, std::span<const uint8_t> key) {
        cert_der = cert.data();
        cert_der_len = cert.size();
        key_der = key.data();
        key_der_len = key.size();
        return *this;
    }
    /** The CA certificate(s) trusted for peers, PEM or DER. */
    engine_config &roots(std::span<const uint8_t> ca) {
        ca_der = ca.data();
        ca_der_len = ca.size();
        return *this;
    }
};

/** A completion time stamp of this header's version, zeroed with struct_size set. */
struct timestamp : qr_timestamp {
    timestamp() : qr_timestamp{} { struct_size = sizeof(qr_timestamp); }
};

/** A fabric (provider "sim" or "soft"). */
class fabric {
public:
    explicit fabric(const char *provider = "sim", uint32_t mtu = 4096) {
        qr_fabric_config c{};
        c.struct_size = sizeof c;
        c.provider = provider;
        c.mtu = mtu;
        check(qr_fabric_new(&c, &f_), "qr_fabric_new");
    }
    ~fabric() { qr_fabric_free(f_); }
    fabric(fabric &&o) noexcept : f_(std::exchange(o.f_, nullptr)) {}
    fabric &operator=(fabric &&o) noexcept {
        if (this != &o) {
            qr_fabric_free(f_);
            f_ = std::exchange(o.f_, nullptr);
        }
        return *this;
    }
    fabric(const fabric &) = delete;
    fabric &operator=(const fabric &) = delete;
    /** The C handle. */
    qr_fabric *get() const noexcept { return f_; }

private:
    qr_fabric *f_ = nullptr;
};

/** One poll-mode QUIC endpoint. */
class engine {
public:
    engine(const fabric &f, const qr_engine_config &c) { check(qr_engine_new(f.get(), &c, &e_), "qr_engine_new"); }
    ~engine() { qr_engine_free(e_); }
    engine(engine &&o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    engine &operator=(engine &&o) noexcept {
        if (this != &o) {
            qr_engine_free(e_);
            e_ = std::exchange(o.e_, nullptr);
        }
        return *this;
    }
    engine(const engine &) = delete;
    engine &operator=(const engine &) = delete;

    /** The C handle. */
    qr_engine *get() const noexcept { return e_; }

    /** Our address, for peers to connect to. */
    qr_addr local_addr() const {
        qr_addr a{};
        check(qr_engine_local_addr(e_, &a), "qr_engine_local_addr");
        return a;
    }

    /** Start a connection; its id. */
    uint64_t connect(const qr_addr &remote, const char *server_name) {
        uint64_t c = 0;
        check(qr_connect(e_, &remote, server_name, &c), "qr_connect");
        return c;
    }

    /** Drive the engine at `now_ns` (0: the library's clock); the events
     * written, as the filled front of `buf` (empty on error: see poll_rc). */
    std::span<qr_event> poll(std::span<qr_event> buf, uint64_t now_ns = 0) noexcept {
        last_rc_ = qr_engine_poll_at(e_, now_ns, buf.data(), buf.size(), sizeof(qr_event));
        return buf.first(last_rc_ > 0 ? static_cast<size_t>(last_rc_) : 0);
    }
    /** The code of the last poll (events written, or QR_E*). */
    int poll_rc() const noexcept { return last_rc_; }

    /** Open a stream; QR_OK with its id in `out`, or QR_EAGAIN at the peer's limit. */
    int open_stream(uint64_t conn, bool bidi, uint64_t &out) noexcept {
        return qr_stream_open(e_, conn, bidi ? 1 : 0, &out);
    }
    /** Write what flow control admits; bytes taken or QR_E*. */
    int64_t write(uint64_t conn, uint64_t stream, std::span<const uint8_t> data) noexcept {
        return qr_stream_write(e_, conn, stream, data.data(), data.size());
    }
    /** Finish the stream (FIN after what was written). */
    int finish(uint64_t conn, uint64_t stream) noexcept { return qr_stream_finish(e_, conn, stream); }
    /** Read into `buf`; bytes read or QR_E* (QR_EAGAIN: nothing yet); `fin` set at the end. */
    int64_t read(uint64_t conn, uint64_t stream, std::span<uint8_t> buf, bool &fin) noexcept {
        int32_t f = 0;
        int64_t n = qr_stream_read(e_, conn, stream, buf.data(), buf.size(), &f);
        fin = f != 0;
        return n;
    }
    /** Send one datagram; QR_OK, or QR_EAGAIN when the queue is full. */
    int send_datagram(uint64_t conn, std::span<const uint8_t> d) noexcept {
        return qr_datagram_send(e_, conn, d.data(), d.size());
    }
    /** Receive one datagram into `buf`; its length or QR_E*. */
    int64_t recv_datagram(uint64_t conn, std::span<uint8_t> buf) noexcept {
        return qr_datagram_recv(e_, conn, buf.data(), buf.size(), nullptr);
    }
    /** Close with an application code and reason phrase. */
    int close(uint64_t conn, uint64_t code, std::string_view reason = {}) noexcept {
        return qr_close(e_, conn, code, reinterpret_cast<const uint8_t *>(reason.data()), reason.size());
    }
    /** Stamp every later send and receive completion of this engine (off by
     * default: no clock is read for it until then); the clock the stamps are
     * on (QR_CLOCK_*). Setup: throws qr::error (QR_EUNSUPPORTED on a device
     * without a completion clock). */
    uint32_t enable_timestamps() {
        uint32_t clock = 0;
        check(qr_engine_enable_timestamps(e_, &clock), "qr_engine_enable_timestamps");
        return clock;
    }
    /** When the packet of the datagram recv_datagram would return next
     * arrived (ask before reading it): QR_OK with `out` written, QR_EAGAIN
     * (none waiting, or stamps off), or QR_E*. Sets `out.struct_size`. */
    int datagram_timestamp(uint64_t conn, qr_timestamp &out) noexcept {
        out.struct_size = sizeof(qr_timestamp);
        return qr_datagram_timestamp(e_, conn, &out);
    }
    /** When the latest packet handled for `conn` arrived (for stream data read
     * after the poll that delivered it): QR_OK, QR_EAGAIN (stamps off, or no
     * packet since), or QR_E*. Sets `out.struct_size`. */
    int rx_timestamp(uint64_t conn, qr_timestamp &out) noexcept {
        out.struct_size = sizeof(qr_timestamp);
        return qr_conn_rx_timestamp(e_, conn, &out);
    }
    /** When the latest signaled send this engine reaped left: QR_OK,
     * QR_EAGAIN (stamps off, or none reaped since), or QR_E*. Sets
     * `out.struct_size`. */
    int send_timestamp(qr_timestamp &out) noexcept {
        out.struct_size = sizeof(qr_timestamp);
        return qr_engine_send_timestamp(e_, &out);
    }
    /** The connection's figures (`qr_conn_stats_get`); throws qr::error on
     * an unknown connection. */
    qr_conn_stats conn_stats(uint64_t conn) const {
        qr_conn_stats st{};
        st.struct_size = sizeof(st);
        check(qr_conn_stats_get(e_, conn, &st), "qr_conn_stats_get");
        return st;
    }
    /** One stream's figures (`qr_stream_stats_get`): QR_OK with `out`
     * written, or QR_E* (QR_ENOCONN; QR_ESTREAM: never opened, or ended
     * before the connection's last 16 ended streams). Sets `out.struct_size`. */
    int stream_stats(uint64_t conn, uint64_t stream, qr_stream_stats &out) const noexcept {
        out = qr_stream_stats{};
        out.struct_size = sizeof(qr_stream_stats);
        return qr_stream_stats_get(e_, conn, stream, &out);
    }
    /** Attach the application's pointer to `conn` (in every later event's `user`). */
    int set_user(uint64_t conn, void *user) noexcept { return qr_conn_set_user(e_, conn, user); }
    /** Why `conn` ended (empty while open). */
    std::string close_reason(uint64_t conn) const {
        size_t need = 0;
        int rc = qr_conn_close_reason(e_, conn, nullptr, 0, &need);
        if (rc == 0) return {};
        if (rc != QR_ETOOSMALL) check(rc, "qr_conn_close_reason");
        std::string s(need, '\0');
        check(qr_conn_close_reason(e_, conn, reinterpret_cast<uint8_t *>(s.data()), s.size(), &need),
              "qr_conn_close_reason");
        return s;
    }

private:
    qr_engine *e_ = nullptr;
    int last_rc_ = 0;
};

/** A self-signed certificate and its PKCS#8 key (DER), for tests and examples. */
struct self_signed {
    std::vector<uint8_t> cert, key;
    explicit self_signed(const char *name) {
        size_t cl = 0, kl = 0;
        int rc = qr_tls_selfsigned(name, nullptr, 0, &cl, nullptr, 0, &kl);
        if (rc != QR_ETOOSMALL) check(rc, "qr_tls_selfsigned");
        cert.resize(cl);
        key.resize(kl);
        check(qr_tls_selfsigned(name, cert.data(), cert.size(), &cl, key.data(), key.size(), &kl),
              "qr_tls_selfsigned");
    }
};

}  // namespace qr

#endif /* QUIC_RDMA_HPP */
