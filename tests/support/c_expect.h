/* Expectations for the C99 tests: a failed one prints where and what, counts
   in `failures`, and the test goes on (main returns non-zero if any failed). */
#ifndef SSA_TEST_C_EXPECT_H
#define SSA_TEST_C_EXPECT_H

#include <stdio.h>

#include "ssa.h"

static int failures = 0;

#define EXPECT(cond)                                                    \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                       \
    }                                                                   \
  } while (0)

/* The call fails with `want` and leaves a non-empty message. */
#define EXPECT_STATUS(call, want)                                         \
  do {                                                                    \
    ssa_status got_ = (call);                                             \
    if (got_ != (want)) {                                                 \
      fprintf(stderr, "%s:%d: %s returned %s, want %s (%s)\n", __FILE__, __LINE__, #call, \
              ssa_status_string(got_), ssa_status_string(want), ssa_last_error_message()); \
      ++failures;                                                         \
    } else if ((want) != SSA_OK && ssa_last_error_message()[0] == '\0') { \
      fprintf(stderr, "%s:%d: %s gave no message\n", __FILE__, __LINE__, #call); \
      ++failures;                                                         \
    }                                                                     \
  } while (0)

#endif
