/* The C tests' checks, shared by every test program: EXPECT a condition
 * (else print where, with the library's last error, and fail the test) and
 * RUN a test, counting it; each program ends by printing
 * "N passed, M failed" from `passed` and `failed`. */
#ifndef QR_TEST_CHECK_H
#define QR_TEST_CHECK_H

#include <stdio.h>

#include "quic_rdma.h"

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

#endif
