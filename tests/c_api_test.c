/* The C API from C99: every function with bad arguments returns the documented
   status with a message and changes nothing; a small good path end to end. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ssa.h"

#include "support/c_expect.h"

/* A dense decode of layer 0 equals want bitwise (the session is as it was). */
static int dense_equals(ssa_session *s, const float *q, const float *want, size_t n_floats) {
  ssa_decode_params p;
  float got[4 * 64];
  ssa_decode_params_init(&p);
  p.method = SSA_METHOD_DENSE;
  if (ssa_decode(s, 0, q, got, &p, NULL) != SSA_OK) return 0;
  return memcmp(got, want, n_floats * sizeof(float)) == 0;
}

/* Every byte of buf still holds the sentinel (a rejected call wrote nothing). */
static int untouched(const float *buf, size_t n_floats) {
  size_t i;
  for (i = 0; i < n_floats; ++i) {
    if (buf[i] != -7.0f) return 0;
  }
  return 1;
}

static void fill_sentinel(float *buf, size_t n_floats) {
  size_t i;
  for (i = 0; i < n_floats; ++i) buf[i] = -7.0f;
}

static float frand(uint32_t *state) {
  *state = *state * 1664525u + 1013904223u;
  return ((float)(*state >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

int main(void) {
  ssa_runtime *rt = NULL;
  ssa_runtime_options ro;
  ssa_session_config cfg;
  ssa_session *s = NULL, *fork = NULL;
  ssa_decode_params p;
  ssa_decode_stats st;
  float *k, *v, q[4 * 64], out[4 * 64], out2[4 * 64], ref[4 * 64];
  const uint64_t n = 3000;
  uint32_t rng = 12345u;
  size_t i;

  EXPECT(ssa_version() == SSA_VERSION_MAJOR * 10000u + SSA_VERSION_MINOR * 100u + SSA_VERSION_PATCH);
  EXPECT(strcmp(ssa_status_string(SSA_ERR_CORRUPT), "SSA_ERR_CORRUPT") == 0);
  EXPECT(ssa_status_string((ssa_status)12345) != NULL);
  EXPECT(sizeof(ssa_status) == 4);

  /* runtime */
  ssa_runtime_options_init(&ro);
  EXPECT_STATUS(ssa_runtime_create(&ro, NULL), SSA_ERR_INVALID_ARGUMENT);
  ro.struct_size = 4;
  EXPECT_STATUS(ssa_runtime_create(&ro, &rt), SSA_ERR_INVALID_ARGUMENT);
  ssa_runtime_options_init(&ro);
  ro.num_threads = -1;
  EXPECT_STATUS(ssa_runtime_create(&ro, &rt), SSA_ERR_INVALID_ARGUMENT);
  ssa_runtime_options_init(&ro);
  ro.backend = (ssa_backend)9;
  EXPECT_STATUS(ssa_runtime_create(&ro, &rt), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(rt == NULL);
  ssa_runtime_options_init(&ro);
  ro.backend = SSA_BACKEND_CPU;
  ro.num_threads = 2;
  EXPECT_STATUS(ssa_runtime_create(&ro, &rt), SSA_OK);
  EXPECT(ssa_last_error_message()[0] == '\0');
  EXPECT(ssa_runtime_backend(rt) == SSA_BACKEND_CPU);
  EXPECT(ssa_runtime_num_threads(rt) == 2);
  ssa_runtime_destroy(NULL);
  ssa_session_destroy(NULL);

  /* session config */
  ssa_session_config_init(&cfg);
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT); /* shape unset */
  cfg.n_layers = 2;
  cfg.n_q_heads = 4;
  cfg.n_kv_heads = 3; /* 4 % 3 != 0 */
  cfg.head_dim = 64;
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
  cfg.n_kv_heads = 2;
  cfg.head_dim = 0;
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
  cfg.head_dim = 60; /* not a multiple of 8 */
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
  cfg.head_dim = 64;
  cfg.pq_subspaces = 7;
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
  cfg.pq_subspaces = 16;
  cfg.pq_centroids = 1000;
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
  cfg.pq_centroids = 256;
  cfg.page_tokens = 100;
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
  cfg.page_tokens = 128;
  cfg.kv_dtype = (ssa_dtype)7;
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
  cfg.kv_dtype = SSA_DTYPE_F32;
  cfg.index_regrow_factor = 0.5f;
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
  cfg.index_regrow_factor = 4.0f;
  /* Limits and hostile shape values: each is rejected with a message naming it. */
  {
    const ssa_session_config good = cfg;
    const uint32_t bad_head_dims[] = {0, 8, 24, 520, 1024, UINT32_MAX};
    const uint32_t bad_layers[] = {0, 65537, UINT32_MAX};
    for (i = 0; i < sizeof bad_head_dims / sizeof bad_head_dims[0]; ++i) {
      cfg.head_dim = bad_head_dims[i];
      EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
      EXPECT(strstr(ssa_last_error_message(), "head_dim") != NULL);
    }
    cfg = good;
    for (i = 0; i < sizeof bad_layers / sizeof bad_layers[0]; ++i) {
      cfg.n_layers = bad_layers[i];
      EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
      EXPECT(strstr(ssa_last_error_message(), "n_layers") != NULL);
    }
    cfg = good;
    cfg.n_kv_heads = UINT32_MAX;
    EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
    cfg = good;
    cfg.n_q_heads = UINT32_MAX;
    EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
    cfg = good;
    cfg.pq_subspaces = 0;
    EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
    cfg = good;
    cfg.index_regrow_factor = NAN;
    EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
    cfg = good;
    cfg.index_iterations = 1001;
    EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
    cfg = good;
    cfg.flags = 0x80u;
    EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
    /* Every field in range, but one page would be 16 GiB: refused at create. */
    cfg = good;
    cfg.n_q_heads = 1024;
    cfg.n_kv_heads = 1024;
    cfg.head_dim = 512;
    cfg.page_tokens = 4096;
    EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(ssa_last_error_message(), "page") != NULL);
    /* The largest accepted n_layers: creating it allocates no pages. */
    cfg = good;
    cfg.n_layers = 65536;
    EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_OK);
    EXPECT(ssa_session_layer_length(s, 65535) == 0);
    ssa_session_destroy(s);
    s = NULL;
    cfg = good;
  }
  /* A small index keeps this program quick under valgrind (CI runs it there). */
  cfg.pq_centroids = 32;
  cfg.index_iterations = 4;
  cfg.index_min_tokens = 1000;
  EXPECT_STATUS(ssa_session_create(NULL, &cfg, &s), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_create(rt, NULL, &s), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_create(rt, &cfg, NULL), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(s == NULL);
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_OK);

  /* append */
  k = (float *)malloc(sizeof(float) * n * 2 * 64);
  v = (float *)malloc(sizeof(float) * n * 2 * 64);
  for (i = 0; i < n * 2 * 64; ++i) {
    k[i] = frand(&rng);
    v[i] = frand(&rng);
  }
  for (i = 0; i < 4 * 64; ++i) q[i] = 3.0f * frand(&rng);
  EXPECT_STATUS(ssa_session_append(NULL, 0, k, v, n), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_append(s, 2, k, v, n), SSA_ERR_INVALID_ARGUMENT); /* layer 2 >= 2 */
  EXPECT(strstr(ssa_last_error_message(), "layer 2") != NULL);
  EXPECT_STATUS(ssa_session_append(s, 0, NULL, v, n), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_append(s, 0, k, NULL, n), SSA_ERR_INVALID_ARGUMENT);
  /* Token counts whose byte sizes overflow, or that exceed the per-layer limit:
     rejected before k or v is read (the arrays hold only n tokens). */
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, UINT64_MAX), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, (uint64_t)UINT32_MAX + 1), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(ssa_last_error_message(), "limit") != NULL);
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, (uint64_t)SIZE_MAX / 4), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, (uint64_t)1 << 62), SSA_ERR_INVALID_ARGUMENT);
  k[100] = NAN;
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, n), SSA_ERR_INVALID_ARGUMENT);
  k[100] = 0.25f;
  v[7] = INFINITY;
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, n), SSA_ERR_INVALID_ARGUMENT);
  v[7] = 0.5f;
  k[n * 2 * 64 - 1] = -INFINITY; /* the very last element is scanned too */
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, n), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(ssa_last_error_message(), "NaN or infinite") != NULL);
  k[n * 2 * 64 - 1] = 0.125f;
  v[0] = -NAN;
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, n), SSA_ERR_INVALID_ARGUMENT);
  /* CPU sessions: the asynchronous append is the plain one, host scan included. */
  EXPECT_STATUS(ssa_session_append_async(s, 0, k, v, n, NULL), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(ssa_last_error_message(), "v[0]") != NULL);
  EXPECT_STATUS(ssa_session_append_async(s, 2, k, v, n, NULL), SSA_ERR_INVALID_ARGUMENT);
  v[0] = 0.5f;
  k[5] = 1e-40f; /* subnormal: finite, accepted (checked below by the good append) */
  EXPECT(ssa_session_layer_length(s, 0) == 0); /* every failure changed nothing */
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, 0), SSA_OK);
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, n), SSA_OK);
  EXPECT_STATUS(ssa_session_append_async(s, 1, k, v, n / 2, NULL), SSA_OK);
  EXPECT(ssa_session_layer_length(s, 0) == n);
  EXPECT(ssa_session_layer_length(s, 5) == 0);
  EXPECT(ssa_session_length(s) == n / 2);
  EXPECT(ssa_session_length(NULL) == 0);

  /* decode */
  ssa_decode_params_init(&p);
  ssa_decode_stats_init(&st);
  p.method = SSA_METHOD_DENSE;
  EXPECT_STATUS(ssa_decode(s, 0, q, ref, &p, &st), SSA_OK);
  EXPECT(st.tokens_read == n * 4);
  EXPECT_STATUS(ssa_decode(NULL, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_decode(s, 9, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_decode(s, 0, NULL, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_decode(s, 0, q, NULL, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_decode(s, 0, q, q, &p, NULL), SSA_ERR_INVALID_ARGUMENT); /* overlap */
  p.method = (ssa_method)42;
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  ssa_decode_params_init(&p);
  p.sparsity = 0.5f;
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  p.sparsity = NAN;
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  ssa_decode_params_init(&p);
  p.heavy_fraction = 1.5f;
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  ssa_decode_params_init(&p);
  p.pi_min = 0.0f;
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  ssa_decode_params_init(&p);
  p.struct_size = 8;
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  ssa_decode_params_init(&p);
  st.struct_size = 3;
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, &st), SSA_ERR_INVALID_ARGUMENT);
  ssa_decode_stats_init(&st);
  {
    const float keep = q[3];
    q[3] = NAN;
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    q[3] = INFINITY;
    fill_sentinel(out, 4 * 64);
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(ssa_last_error_message(), "q[3]") != NULL);
    q[3] = -INFINITY;
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    EXPECT(untouched(out, 4 * 64));
    q[3] = keep;
  }
  /* Hostile decode parameters: rejected with nothing written to out. */
  {
    const float bad_sparsity[] = {0.0f, 0.999f, -1.0f, INFINITY, -INFINITY};
    fill_sentinel(out, 4 * 64);
    for (i = 0; i < sizeof bad_sparsity / sizeof bad_sparsity[0]; ++i) {
      ssa_decode_params_init(&p);
      p.sparsity = bad_sparsity[i];
      EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
      EXPECT(strstr(ssa_last_error_message(), "sparsity") != NULL);
    }
    ssa_decode_params_init(&p);
    p.heavy_fraction = NAN;
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    p.heavy_fraction = -0.1f;
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    ssa_decode_params_init(&p);
    p.pi_min = NAN;
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    p.pi_min = 1.5f;
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    EXPECT(untouched(out, 4 * 64));
    ssa_decode_params_init(&p);
  }
  /* Selection traces from C: the same output as ssa_decode, rows in ascending
     order, per-head counts summing to tokens_read; a capacity too small is
     refused with out untouched and the capacity needed in the offsets. */
  {
    uint32_t *rows = (uint32_t *)malloc(sizeof(uint32_t) * 4 * n);
    uint64_t offsets[5];
    uint64_t h, r;
    ssa_decode_params_init(&p);
    p.sparsity = 10.0f;
    p.n_sink = 16;
    p.n_local = 16;
    p.step = 2;
    ssa_decode_stats_init(&st);
    EXPECT_STATUS(ssa_decode(s, 0, q, out2, &p, NULL), SSA_OK);
    EXPECT_STATUS(ssa_decode_traced(s, 0, q, out, &p, &st, rows, NULL, 4 * n, offsets), SSA_OK);
    EXPECT(memcmp(out, out2, sizeof(out)) == 0);
    EXPECT(offsets[0] == 0 && offsets[4] == st.tokens_read);
    for (h = 0; h < 4; ++h) {
      EXPECT(offsets[h + 1] - offsets[h] <= (n + 9) / 10);
      EXPECT(rows[offsets[h]] == 0 && rows[offsets[h + 1] - 1] == n - 1);
      for (r = offsets[h] + 1; r < offsets[h + 1]; ++r) EXPECT(rows[r - 1] < rows[r]);
    }
    fill_sentinel(out, 4 * 64);
    EXPECT_STATUS(ssa_decode_traced(s, 0, q, out, &p, NULL, rows, NULL, offsets[4] - 1, offsets),
                  SSA_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(ssa_last_error_message(), "too small") != NULL);
    EXPECT(untouched(out, 4 * 64));
    EXPECT(offsets[4] == st.tokens_read);
    EXPECT_STATUS(ssa_decode_traced(s, 0, q, out, &p, NULL, rows, NULL, 4 * n, NULL), SSA_ERR_INVALID_ARGUMENT);
    free(rows);
    ssa_decode_params_init(&p);
  }
  /* Budgets at or above N, and sink/local windows covering everything, are
     legal and mean dense attention, bitwise. */
  {
    const uint32_t big_budgets[] = {(uint32_t)n, (uint32_t)n + 1, UINT32_MAX};
    for (i = 0; i < sizeof big_budgets / sizeof big_budgets[0]; ++i) {
      ssa_decode_params_init(&p);
      p.budget = big_budgets[i];
      EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_OK);
      EXPECT(memcmp(out, ref, sizeof(out)) == 0);
    }
    ssa_decode_params_init(&p);
    p.n_sink = UINT32_MAX;
    p.n_local = UINT32_MAX;
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_OK);
    EXPECT(memcmp(out, ref, sizeof(out)) == 0);
    ssa_decode_params_init(&p);
  }
  /* None of the rejected calls above changed the session. */
  EXPECT(ssa_session_layer_length(s, 0) == n && ssa_session_length(s) == n / 2);
  EXPECT(dense_equals(s, q, ref, 4 * 64));
  {
    ssa_session *empty = NULL;
    EXPECT_STATUS(ssa_session_create(rt, &cfg, &empty), SSA_OK);
    EXPECT_STATUS(ssa_decode(empty, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    ssa_session_destroy(empty);
  }

  /* error-targeted decode: defaults, bad values of the appended fields */
  ssa_decode_params_init(&p);
  EXPECT(p.target_error == 0.0f && p.target_delta == 0.1f && p.max_budget == 0);
  {
    const float bad_eps[] = {-0.1f, NAN, INFINITY};
    const float bad_delta[] = {0.0f, 1.0f, -0.2f, 2.0f, NAN};
    const ssa_method no_target[] = {SSA_METHOD_DENSE, SSA_METHOD_ORACLE_TOPK, SSA_METHOD_PQ_TOPK,
                                    SSA_METHOD_HYBRID_UNIFORM, SSA_METHOD_SAMPLING};
    float untouched[4 * 64];
    for (i = 0; i < 4 * 64; ++i) out[i] = 7.0f;
    memcpy(untouched, out, sizeof(out));
    for (i = 0; i < sizeof(bad_eps) / sizeof(bad_eps[0]); ++i) {
      ssa_decode_params_init(&p);
      p.target_error = bad_eps[i];
      EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
      EXPECT(strstr(ssa_last_error_message(), "target_error") != NULL);
    }
    for (i = 0; i < sizeof(bad_delta) / sizeof(bad_delta[0]); ++i) {
      ssa_decode_params_init(&p);
      p.target_error = 0.1f;
      p.target_delta = bad_delta[i];
      EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
      EXPECT(strstr(ssa_last_error_message(), "target_delta") != NULL);
    }
    for (i = 0; i < sizeof(no_target) / sizeof(no_target[0]); ++i) {
      ssa_decode_params_init(&p);
      p.method = no_target[i];
      p.target_error = 0.1f;
      EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    }
    ssa_decode_params_init(&p);
    p.target_error = 0.1f;
    p.heavy_fraction = 1.0f;
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    ssa_decode_params_init(&p);
    p.target_error = 0.1f;
    p.budget = 600;
    p.max_budget = 500;
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    EXPECT(memcmp(out, untouched, sizeof(out)) == 0);
    /* a good request: within the cap, stats filled */
    ssa_decode_params_init(&p);
    p.target_error = 0.2f;
    p.n_sink = p.n_local = 16;
    p.max_budget = 1000;
    ssa_decode_stats_init(&st);
    EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, &st), SSA_OK);
    EXPECT(st.target_budget > 0 && st.target_budget <= 4 * 1000);
    EXPECT(st.tokens_read <= st.target_budget);
    EXPECT(st.capped_heads <= 4);
    EXPECT(st.predicted_error > 0.0);
  }
  ssa_decode_params_init(&p);

  /* NULL params = defaults (SSA at 50x); deterministic for equal step */
  p.step = 0;
  EXPECT_STATUS(ssa_decode(s, 0, q, out, NULL, &st), SSA_OK);
  EXPECT(st.tokens_read <= 4 * ((n + 49) / 50 + 256));
  EXPECT_STATUS(ssa_decode(s, 0, q, out2, &p, NULL), SSA_OK);
  EXPECT(memcmp(out, out2, sizeof(out)) == 0);
  /* budget >= N: exactly dense */
  p.budget = (uint32_t)n;
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, NULL), SSA_OK);
  EXPECT(memcmp(out, ref, sizeof(out)) == 0);

  /* decode steps: one call appends a token and decodes (CPU sessions: eagerly),
     on a session of its own */
  {
    ssa_session *ds = NULL;
    float sk[2 * 64], sv[2 * 64];
    uint64_t dropped = 9;
    EXPECT_STATUS(ssa_session_create(rt, &cfg, &ds), SSA_OK);
    EXPECT_STATUS(ssa_session_reserve(ds, 4), SSA_ERR_INVALID_ARGUMENT); /* empty layers */
    for (i = 0; i < 2 * 64; ++i) {
      sk[i] = frand(&rng);
      sv[i] = frand(&rng);
    }
    EXPECT_STATUS(ssa_session_append(ds, 0, sk, sv, 1), SSA_OK);
    EXPECT_STATUS(ssa_session_append(ds, 1, sk, sv, 1), SSA_OK);
    EXPECT_STATUS(ssa_session_reserve(ds, 4), SSA_OK);
    EXPECT_STATUS(ssa_session_reserve(ds, 0), SSA_ERR_INVALID_ARGUMENT);
    ssa_decode_params_init(&p);
    EXPECT_STATUS(ssa_decode_step(ds, 1, sk, sv, q, out, &p, NULL), SSA_OK);
    EXPECT(ssa_session_layer_length(ds, 1) == 2);
    EXPECT_STATUS(ssa_decode_step(ds, 1, NULL, sv, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ssa_decode_step(ds, 2, sk, sv, q, out, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
    EXPECT(ssa_session_layer_length(ds, 1) == 2);
    EXPECT_STATUS(ssa_session_sync(ds, &dropped), SSA_OK);
    EXPECT(dropped == 0);
    EXPECT_STATUS(ssa_session_sync(NULL, &dropped), SSA_ERR_INVALID_ARGUMENT);
    ssa_session_destroy(ds);
  }

  /* batch */
  {
    ssa_decode_item items[2];
    items[0].session = s;
    items[0].q = q;
    items[0].out = out;
    items[1].session = s;
    items[1].q = q;
    items[1].out = out2;
    ssa_decode_params_init(&p);
    p.method = SSA_METHOD_DENSE;
    EXPECT_STATUS(ssa_decode_batch(items, 2, 0, &p), SSA_OK);
    EXPECT(memcmp(out, ref, sizeof(out)) == 0 && memcmp(out2, ref, sizeof(out)) == 0);
    EXPECT_STATUS(ssa_decode_batch(NULL, 2, 0, &p), SSA_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ssa_decode_batch(items, 0, 0, &p), SSA_OK);
    items[1].out = out; /* two items write the same output */
    EXPECT_STATUS(ssa_decode_batch(items, 2, 0, &p), SSA_ERR_INVALID_ARGUMENT);
    items[1].out = out + 100; /* partly over item 0's output */
    EXPECT_STATUS(ssa_decode_batch(items, 2, 0, &p), SSA_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(ssa_last_error_message(), "overlaps") != NULL);
    items[1].out = q; /* over the query both items read */
    EXPECT_STATUS(ssa_decode_batch(items, 2, 0, &p), SSA_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(ssa_last_error_message(), "item 1") != NULL);
    items[0].out = out2; /* swapped outputs are fine: no overlap */
    items[1].out = out;
    EXPECT_STATUS(ssa_decode_batch(items, 2, 0, &p), SSA_OK);
    items[0].out = out;
    items[1].out = out2;
    items[1].session = NULL;
    EXPECT_STATUS(ssa_decode_batch(items, 2, 0, &p), SSA_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(ssa_last_error_message(), "item 1") != NULL);
    /* A NaN in one item's query: the batch is rejected before any item runs. */
    {
      float bad_q[4 * 64];
      memcpy(bad_q, q, sizeof bad_q);
      bad_q[4 * 64 - 1] = NAN;
      items[1].session = s;
      items[1].q = bad_q;
      fill_sentinel(out, 4 * 64);
      fill_sentinel(out2, 4 * 64);
      EXPECT_STATUS(ssa_decode_batch(items, 2, 0, &p), SSA_ERR_INVALID_ARGUMENT);
      EXPECT(strstr(ssa_last_error_message(), "item 1") != NULL);
      EXPECT(untouched(out, 4 * 64) && untouched(out2, 4 * 64));
      p.sparsity = 0.5f;
      items[1].q = q;
      EXPECT_STATUS(ssa_decode_batch(items, 2, 0, &p), SSA_ERR_INVALID_ARGUMENT);
      EXPECT(untouched(out, 4 * 64) && untouched(out2, 4 * 64));
    }
  }

  /* fork, truncate, config, index */
  EXPECT_STATUS(ssa_session_fork(NULL, &fork), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_fork(s, NULL), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_fork(s, &fork), SSA_OK);
  EXPECT_STATUS(ssa_session_truncate(fork, n), SSA_ERR_INVALID_ARGUMENT); /* > length n/2 */
  EXPECT_STATUS(ssa_session_truncate(NULL, 1), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_truncate(s, UINT64_MAX), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(ssa_session_layer_length(s, 0) == n && dense_equals(s, q, ref, 4 * 64));
  EXPECT_STATUS(ssa_session_truncate(fork, 100), SSA_OK);
  EXPECT(ssa_session_length(fork) == 100 && ssa_session_length(s) == n / 2);
  EXPECT_STATUS(ssa_session_update_index(NULL), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_update_index(fork), SSA_OK);
  {
    ssa_session_config got;
    ssa_session_config_init(&got);
    EXPECT_STATUS(ssa_session_get_config(s, &got), SSA_OK);
    EXPECT(got.n_q_heads == 4 && got.head_dim == 64 && got.kv_dtype == SSA_DTYPE_F32);
    EXPECT_STATUS(ssa_session_get_config(s, NULL), SSA_ERR_INVALID_ARGUMENT);
    got.struct_size = 1;
    EXPECT_STATUS(ssa_session_get_config(s, &got), SSA_ERR_INVALID_ARGUMENT);
  }

  /* Half-precision sessions: NaN and infinity bit patterns of F16 and BF16 are
     rejected; the largest finite values are accepted. */
  {
    const ssa_dtype types[2] = {SSA_DTYPE_F16, SSA_DTYPE_BF16};
    const uint16_t bad_bits[2][2] = {{0x7e00u, 0xfc00u}, {0x7fc1u, 0xff80u}};
    const uint16_t max_finite[2] = {0x7bffu, 0x7f7fu};
    static uint16_t hk[16 * 2 * 64], hv[16 * 2 * 64]; /* 16 tokens of zeros */
    size_t t, b;
    for (t = 0; t < 2; ++t) {
      ssa_session_config hc = cfg;
      ssa_session *h = NULL;
      hc.kv_dtype = types[t];
      EXPECT_STATUS(ssa_session_create(rt, &hc, &h), SSA_OK);
      for (b = 0; b < 2; ++b) {
        hk[37] = bad_bits[t][b];
        EXPECT_STATUS(ssa_session_append(h, 0, hk, hv, 16), SSA_ERR_INVALID_ARGUMENT);
        EXPECT(strstr(ssa_last_error_message(), "k[37]") != NULL);
        hk[37] = 0;
        hv[16 * 2 * 64 - 1] = bad_bits[t][b];
        EXPECT_STATUS(ssa_session_append(h, 0, hk, hv, 16), SSA_ERR_INVALID_ARGUMENT);
        hv[16 * 2 * 64 - 1] = 0;
      }
      EXPECT(ssa_session_layer_length(h, 0) == 0);
      hk[38] = max_finite[t];
      EXPECT_STATUS(ssa_session_append(h, 0, hk, hv, 16), SSA_OK);
      hk[38] = 0;
      EXPECT(ssa_session_layer_length(h, 0) == 16);
      ssa_session_destroy(h);
    }
  }

  /* snapshot arguments */
  EXPECT(ssa_session_save(NULL, "/tmp/x.ssa") != SSA_OK);
  EXPECT(ssa_session_load(rt, NULL, 0, &fork) != SSA_OK);

  ssa_session_destroy(fork);
  ssa_session_destroy(s);
  ssa_runtime_destroy(rt);
  free(k);
  free(v);
  if (failures != 0) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("c api test: all expectations met\n");
  return 0;
}
