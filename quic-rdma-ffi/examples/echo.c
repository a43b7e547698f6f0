/* Echo over quic-rdma: an echo server (every stream it receives is sent back,
 * then finished) and a client that sends a message per stream and prints the
 * echo. Both run in this process on the in-process "sim" fabric, driven by one
 * loop; the server and client halves are separate functions, as they would be
 * in two programs.
 *
 *   echo [message ...]
 */
#include "qr_pair.h"

#define MAX_STREAMS 64

/* Server half: echo whatever arrives on each stream; finish on the peer's fin. */
static void server_poll(qr_pair *p) {
    static uint8_t buf[65536];
    for (int k = 0; k < p->nsev; k++) {
        qr_event *ev = &p->sev[k];
        if (ev->kind != QR_EVENT_STREAM_READABLE) continue;
        for (;;) {
            int fin = 0;
            long long n = qr_stream_read(p->server, ev->conn, ev->stream, buf, sizeof buf, &fin);
            if (n == QR_EAGAIN || n == QR_ESTREAM) break;
            QR_CHECK(n);
            for (long long off = 0; off < n;) {
                long long w = qr_stream_write(p->server, ev->conn, ev->stream, buf + off,
                                              (size_t)(n - off));
                if (w == QR_EAGAIN) { qr_pair_step(p); continue; }
                QR_CHECK(w);
                off += w;
            }
            if (fin) {
                QR_CHECK(qr_stream_finish(p->server, ev->conn, ev->stream));
                break;
            }
        }
    }
}

int main(int argc, char **argv) {
    const char *defaults[] = {"hello", "quic over rdma ud"};
    const char **msgs = argc > 1 ? (const char **)argv + 1 : defaults;
    int nmsgs = argc > 1 ? argc - 1 : 2;
    if (nmsgs > MAX_STREAMS) nmsgs = MAX_STREAMS;
    qr_pair p;
    qr_pair_init(&p, "sim");
    if (qr_pair_connect(&p) != 0) {
        fprintf(stderr, "handshake failed\n");
        return 1;
    }
    for (int m = 0; m < nmsgs; m++) {
        uint64_t s;
        QR_CHECK(qr_stream_open(p.client, p.client_conn, 1, &s));
        size_t len = strlen(msgs[m]);
        QR_CHECK(qr_stream_write(p.client, p.client_conn, s, (const uint8_t *)msgs[m], len));
        QR_CHECK(qr_stream_finish(p.client, p.client_conn, s));
        char back[4096];
        size_t got = 0;
        int fin = 0;
        for (unsigned long long i = 0; !fin && i < QR_PAIR_MAX_SPINS; i++) {
            qr_pair_step(&p);
            server_poll(&p);
            long long n = qr_stream_read(p.client, p.client_conn, s, (uint8_t *)back + got,
                                         sizeof back - 1 - got, &fin);
            if (n == QR_EAGAIN) continue;
            QR_CHECK(n);
            got += (size_t)n;
        }
        back[got] = 0;
        printf("echo: %s\n", back);
        if (got != len || memcmp(back, msgs[m], len) != 0) {
            fprintf(stderr, "echo mismatch\n");
            return 1;
        }
    }
    QR_CHECK(qr_close(p.client, p.client_conn, 0, NULL, 0));
    int closed = 0;
    for (unsigned long long i = 0; !closed && i < QR_PAIR_MAX_SPINS; i++) {
        qr_pair_step(&p);
        for (int k = 0; k < p.nsev; k++)
            if (p.sev[k].kind == QR_EVENT_CONNECTION_LOST) closed = 1;
    }
    printf("server saw the close: %s\n", closed ? "yes" : "no");
    qr_pair_free(&p);
    return closed ? 0 : 1;
}
