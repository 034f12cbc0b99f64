/* The checks of the hostile-use programs: each counts a surprise in `failures` and
 * says where, so one run reports every call that was not refused as documented. */
#ifndef ZCS_TEST_EXPECT_H
#define ZCS_TEST_EXPECT_H

#include <stdio.h>

#include <zenoh_cuda_shm.h>

static int failures = 0;

/* `call` returns `want`, and a failing call leaves a message. */
#define EXPECT(call, want)                                                                        \
    do {                                                                                          \
        zcs_result_t got_ = (call);                                                               \
        if (got_ != (want)) {                                                                     \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", __FILE__, __LINE__, #call, \
                    zcs_result_name(got_), zcs_result_name(want), zcs_last_error());              \
            failures++;                                                                           \
        } else if ((want) != ZCS_OK && zcs_last_error()[0] == '\0') {                             \
            fprintf(stderr, "%s:%d: %s gave no message\n", __FILE__, __LINE__, #call);             \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

/* `cond` holds. */
#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);      \
            failures++;                                                              \
        }                                                                            \
    } while (0)

#endif
