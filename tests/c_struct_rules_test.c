/* The versioned-struct rule and the enum rule of ssa.h's Conventions, from C99
   against the shared library: for every versioned struct, every struct_size
   that ends on a field boundary from the core up is accepted and only that
   prefix is read (inputs: the rest takes defaults) or written (outputs); sizes
   below the core or inside a field are rejected; a larger size is accepted with
   zero bytes beyond the struct (inputs; outputs get zeros there) and refused
   with SSA_ERR_UNSUPPORTED otherwise, and a size above SSA_MAX_STRUCT_SIZE is
   refused before anything beyond the struct is touched. Every enum, in a struct or an argument,
   with an out-of-range value gives SSA_ERR_INVALID_ARGUMENT (in the sanitizer
   build, UBSan aborts this test if the library loads such a value as an enum).
   The field tables here are written from the header independently of the
   library's own. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ssa.h"

#include "support/c_expect.h"

#define END(T, f) (offsetof(T, f) + sizeof(((T *)0)->f))

/* The ends of a struct's fields from its core on (the last entry is sizeof). */
typedef struct sizes {
  size_t n;
  size_t at[24];
} sizes;

static void add(sizes *s, size_t end) { s->at[s->n++] = end; }

/* A size strictly inside the field that ends at `end` (begins at `begin`). */
static size_t inside(size_t begin, size_t end) { return end - begin > 1 ? begin + 1 : 0; }

static float frand(uint32_t *state) {
  *state = *state * 1664525u + 1013904223u;
  return ((float)(*state >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

enum { NQ = 4, NKV = 2, D = 64, N = 1200 };

/* Big enough for any struct of this header plus bytes beyond it. */
typedef union big {
  unsigned char bytes[512];
  uint64_t align;
} big;

static ssa_session_config shape(void) {
  ssa_session_config c;
  ssa_session_config_init(&c);
  c.n_layers = 1;
  c.n_q_heads = NQ;
  c.n_kv_heads = NKV;
  c.head_dim = D;
  c.kv_dtype = SSA_DTYPE_F32;
  c.pq_subspaces = 8;
  c.pq_centroids = 16;
  return c;
}

static void test_runtime_options(void) {
  big b;
  ssa_runtime_options o;
  ssa_runtime *rt = NULL;
  ssa_runtime_options_init(&o);
  o.backend = SSA_BACKEND_CPU;
  o.num_threads = 1;
  /* The core ends at seed; below it, or inside a field, is refused. */
  o.struct_size = (uint32_t)offsetof(ssa_runtime_options, seed);
  EXPECT_STATUS(ssa_runtime_create(&o, &rt), SSA_ERR_INVALID_ARGUMENT);
  o.struct_size = (uint32_t)(offsetof(ssa_runtime_options, seed) + 4);
  EXPECT_STATUS(ssa_runtime_create(&o, &rt), SSA_ERR_INVALID_ARGUMENT);
  o.struct_size = (uint32_t)(offsetof(ssa_runtime_options, device_kv_budget) + 4);
  EXPECT_STATUS(ssa_runtime_create(&o, &rt), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(rt == NULL);
  {
    /* Sizes that end at a field boundary: later fields keep their defaults, so
       bytes beyond the caller's size (here a budget a cache would exceed) are
       never read. */
    const size_t ends[] = {END(ssa_runtime_options, seed), END(ssa_runtime_options, device_kv_budget)};
    size_t i;
    for (i = 0; i < sizeof ends / sizeof ends[0]; ++i) {
      memset(&b, 0, sizeof b);
      o.device_kv_budget = 1u << 20;
      o.host_cache_bytes = 2u << 20;
      o.struct_size = (uint32_t)ends[i];
      memcpy(b.bytes, &o, sizeof o);
      EXPECT_STATUS(ssa_runtime_create((const ssa_runtime_options *)(void *)b.bytes, &rt), SSA_OK);
      ssa_runtime_destroy(rt);
      rt = NULL;
    }
    /* The whole struct: a cache larger than the budget is refused. */
    o.struct_size = sizeof o;
    EXPECT_STATUS(ssa_runtime_create(&o, &rt), SSA_ERR_INVALID_ARGUMENT);
    EXPECT(rt == NULL);
    o.host_cache_bytes = 1u << 18;
    EXPECT_STATUS(ssa_runtime_create(&o, &rt), SSA_OK); /* CPU runtimes accept and ignore a budget */
    ssa_runtime_destroy(rt);
    rt = NULL;
    o.device_kv_budget = 0;
    o.host_cache_bytes = 0;
  }
  o.struct_size = (uint32_t)inside(offsetof(ssa_runtime_options, shard_tokens), END(ssa_runtime_options, shard_tokens));
  EXPECT_STATUS(ssa_runtime_create(&o, &rt), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(rt == NULL);
  /* Every size from the core on that ends on a field: the fields beyond it
     hold values create would refuse, and are not read. */
  {
    const size_t ends[] = {END(ssa_runtime_options, seed), END(ssa_runtime_options, devices),
                           END(ssa_runtime_options, n_devices), END(ssa_runtime_options, shard_tokens),
                           END(ssa_runtime_options, communicator), END(ssa_runtime_options, collective)};
    size_t i;
    for (i = 0; i < sizeof ends / sizeof ends[0]; ++i) {
      ssa_runtime_options bad = o;
      memset(b.bytes, 0xEE, sizeof b.bytes);
      bad.struct_size = (uint32_t)ends[i];
      memcpy(b.bytes, &bad, ends[i]);
      rt = NULL;
      EXPECT_STATUS(ssa_runtime_create((const ssa_runtime_options *)(void *)b.bytes, &rt), SSA_OK);
      EXPECT(rt != NULL && ssa_runtime_num_shards(rt) == 1);
      ssa_runtime_destroy(rt);
    }
    rt = NULL;
  }
  memset(&b, 0, sizeof b);
  o.struct_size = (uint32_t)(sizeof o + 16);
  memcpy(b.bytes, &o, sizeof o);
  EXPECT_STATUS(ssa_runtime_create((const ssa_runtime_options *)(void *)b.bytes, &rt), SSA_OK);
  EXPECT(rt != NULL && ssa_runtime_num_threads(rt) == 1);
  ssa_runtime_destroy(rt);
  rt = NULL;
  b.bytes[sizeof o + 15] = 1;
  EXPECT_STATUS(ssa_runtime_create((const ssa_runtime_options *)(void *)b.bytes, &rt), SSA_ERR_UNSUPPORTED);
  EXPECT(rt == NULL);
  /* Enum out of range. */
  ssa_runtime_options_init(&o);
  o.backend = (ssa_backend)0xFFFFFFFFu;
  EXPECT_STATUS(ssa_runtime_create(&o, &rt), SSA_ERR_INVALID_ARGUMENT);
  o.backend = (ssa_backend)3;
  EXPECT_STATUS(ssa_runtime_create(&o, &rt), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(rt == NULL);
}

/* Config boundaries from the core (model_fingerprint) on. */
static sizes config_sizes(void) {
  sizes s = {0, {0}};
  add(&s, END(ssa_session_config, model_fingerprint));
  add(&s, END(ssa_session_config, page_tokens));
  add(&s, END(ssa_session_config, flags));
  add(&s, END(ssa_session_config, index_min_tokens));
  add(&s, END(ssa_session_config, index_regrow_factor));
  add(&s, END(ssa_session_config, index_train_sample));
  add(&s, END(ssa_session_config, index_iterations));
  add(&s, END(ssa_session_config, proxy));
  add(&s, END(ssa_session_config, pq_parallel_weight));
  add(&s, sizeof(ssa_session_config));
  return s;
}

static void test_session_config(ssa_runtime *rt, const char *path) {
  const sizes sz = config_sizes();
  ssa_session_config defaults, c, got;
  ssa_session *s = NULL;
  size_t i;
  ssa_session_config_init(&defaults);
  for (i = 0; i < sz.n; ++i) {
    /* Every field beyond the size holds a value create would reject. */
    big b;
    c = shape();
    memset(b.bytes, 0xEE, sizeof b.bytes);
    c.struct_size = (uint32_t)(sz.at[i] >= sizeof c ? sizeof c + 16 : sz.at[i]);
    memcpy(b.bytes, &c, sz.at[i] < sizeof c ? sz.at[i] : sizeof c);
    s = NULL;
    EXPECT_STATUS(ssa_session_create(rt, (const ssa_session_config *)(void *)b.bytes, &s),
                  sz.at[i] >= sizeof c ? SSA_ERR_UNSUPPORTED : SSA_OK);
    if (sz.at[i] >= sizeof c) {
      memset(b.bytes + sizeof c, 0, sizeof b.bytes - sizeof c);
      EXPECT_STATUS(ssa_session_create(rt, (const ssa_session_config *)(void *)b.bytes, &s), SSA_OK);
    }
    if (s == NULL) continue;
    ssa_session_config_init(&got);
    EXPECT_STATUS(ssa_session_get_config(s, &got), SSA_OK);
    EXPECT(got.n_q_heads == NQ && got.pq_centroids == 16);
    if (sz.at[i] < END(ssa_session_config, page_tokens)) EXPECT(got.page_tokens == defaults.page_tokens);
    if (sz.at[i] < END(ssa_session_config, index_iterations))
      EXPECT(got.index_iterations == defaults.index_iterations);
    if (sz.at[i] < END(ssa_session_config, proxy)) EXPECT(got.proxy == SSA_PROXY_PQ);
    if (sz.at[i] < END(ssa_session_config, pq_parallel_weight)) EXPECT(got.pq_parallel_weight == 1.0f);
    /* get_config writes only the caller's prefix. */
    memset(b.bytes, 0xAB, sizeof b.bytes);
    ((ssa_session_config *)(void *)b.bytes)->struct_size = (uint32_t)sz.at[i];
    EXPECT_STATUS(ssa_session_get_config(s, (ssa_session_config *)(void *)b.bytes), SSA_OK);
    EXPECT(((ssa_session_config *)(void *)b.bytes)->n_kv_heads == NKV);
    if (sz.at[i] < sizeof c) EXPECT(b.bytes[sz.at[i]] == 0xAB);
    /* load_checked takes the same sizes for `expected`. */
    if (i == 0) EXPECT_STATUS(ssa_session_save(s, path), SSA_OK);
    {
      ssa_session *loaded = NULL;
      c = shape();
      memset(b.bytes, 0xEE, sizeof b.bytes);
      c.struct_size = (uint32_t)(sz.at[i] >= sizeof c ? sizeof c + 16 : sz.at[i]);
      memcpy(b.bytes, &c, sz.at[i] < sizeof c ? sz.at[i] : sizeof c);
      if (sz.at[i] >= sizeof c) memset(b.bytes + sizeof c, 0, sizeof b.bytes - sizeof c);
      EXPECT_STATUS(ssa_session_load_checked(rt, path, 0, (const ssa_session_config *)(void *)b.bytes, &loaded),
                    SSA_OK);
      ssa_session_destroy(loaded);
    }
    ssa_session_destroy(s);
  }
  /* Below the core, inside a field. */
  c = shape();
  s = NULL;
  c.struct_size = (uint32_t)offsetof(ssa_session_config, model_fingerprint);
  EXPECT_STATUS(ssa_session_create(rt, &c, &s), SSA_ERR_INVALID_ARGUMENT);
  c.struct_size = (uint32_t)inside(offsetof(ssa_session_config, index_regrow_factor),
                                   END(ssa_session_config, index_regrow_factor));
  EXPECT_STATUS(ssa_session_create(rt, &c, &s), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_load_checked(rt, path, 0, &c, &s), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(s == NULL);
  /* Enum out of range. */
  c = shape();
  c.kv_dtype = (ssa_dtype)0xFFFFFFFFu;
  EXPECT_STATUS(ssa_session_create(rt, &c, &s), SSA_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ssa_session_load_checked(rt, path, 0, &c, &s), SSA_ERR_INVALID_ARGUMENT);
  c.kv_dtype = (ssa_dtype)3;
  EXPECT_STATUS(ssa_session_create(rt, &c, &s), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(s == NULL);
  c = shape();
  c.proxy = (ssa_proxy)0xFFFFFFFFu;
  EXPECT_STATUS(ssa_session_create(rt, &c, &s), SSA_ERR_INVALID_ARGUMENT);
  c.proxy = (ssa_proxy)6;
  EXPECT_STATUS(ssa_session_create(rt, &c, &s), SSA_ERR_INVALID_ARGUMENT);
  EXPECT(s == NULL);
  /* pq_parallel_weight: 0 or [1, 1000]. */
  {
    const float bad[] = {0.5f, -1.0f, 1000.5f, NAN, INFINITY};
    for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
      c = shape();
      c.pq_parallel_weight = bad[i];
      EXPECT_STATUS(ssa_session_create(rt, &c, &s), SSA_ERR_INVALID_ARGUMENT);
      EXPECT(s == NULL);
    }
  }
}

static sizes params_sizes(void) {
  sizes s = {0, {0}};
  add(&s, END(ssa_decode_params, stream));
  add(&s, END(ssa_decode_params, target_error));
  add(&s, END(ssa_decode_params, target_delta));
  add(&s, END(ssa_decode_params, max_budget));
  add(&s, END(ssa_decode_params, group_selection));
  add(&s, sizeof(ssa_decode_params));
  return s;
}

static sizes stats_sizes(void) {
  sizes s = {0, {0}};
  add(&s, END(ssa_decode_stats, unique_samples));
  add(&s, END(ssa_decode_stats, residual_proxy_mass));
  add(&s, END(ssa_decode_stats, scored_tokens));
  add(&s, END(ssa_decode_stats, target_budget));
  add(&s, END(ssa_decode_stats, capped_heads));
  add(&s, END(ssa_decode_stats, predicted_error));
  add(&s, END(ssa_decode_stats, window_only_heads));
  add(&s, END(ssa_decode_stats, rows_from_host));
  add(&s, END(ssa_decode_stats, host_cache_hits));
  add(&s, sizeof(ssa_decode_stats));
  return s;
}

static void test_decode_structs(ssa_session *s, const float *q) {
  const sizes ps = params_sizes(), ss = stats_sizes();
  ssa_decode_params p;
  ssa_decode_stats full;
  float want[NQ * D], got[NQ * D];
  size_t i;
  ssa_decode_params_init(&p);
  p.sparsity = 2.0f; /* a budget beyond sink + local: sampling happens */
  p.n_sink = 16;
  p.n_local = 16;
  p.step = 3;
  ssa_decode_stats_init(&full);
  EXPECT_STATUS(ssa_decode(s, 0, q, want, &p, &full), SSA_OK);
  EXPECT(full.draws > 0 && full.heavy_tokens > 0 && full.window_only_heads == 0);
  for (i = 0; i < ps.n; ++i) {
    /* Fields beyond the size hold values decode would reject. */
    big b;
    ssa_decode_item item;
    memset(b.bytes, 0xFF, sizeof b.bytes);
    p.struct_size = (uint32_t)(ps.at[i] >= sizeof p ? sizeof p + 16 : ps.at[i]);
    memcpy(b.bytes, &p, ps.at[i] < sizeof p ? ps.at[i] : sizeof p);
    if (ps.at[i] >= sizeof p) {
      EXPECT_STATUS(ssa_decode(s, 0, q, got, (const ssa_decode_params *)(void *)b.bytes, NULL),
                    SSA_ERR_UNSUPPORTED);
      memset(b.bytes + sizeof p, 0, sizeof b.bytes - sizeof p);
    }
    EXPECT_STATUS(ssa_decode(s, 0, q, got, (const ssa_decode_params *)(void *)b.bytes, NULL), SSA_OK);
    EXPECT(memcmp(got, want, sizeof got) == 0);
    item.session = s;
    item.q = q;
    item.out = got;
    EXPECT_STATUS(ssa_decode_batch(&item, 1, 0, (const ssa_decode_params *)(void *)b.bytes), SSA_OK);
    EXPECT(memcmp(got, want, sizeof got) == 0);
  }
  p.struct_size = (uint32_t)offsetof(ssa_decode_params, stream);
  EXPECT_STATUS(ssa_decode(s, 0, q, got, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  p.struct_size = (uint32_t)inside(offsetof(ssa_decode_params, target_delta), END(ssa_decode_params, target_delta));
  EXPECT_STATUS(ssa_decode(s, 0, q, got, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  p.struct_size = sizeof p;
  for (i = 0; i < ss.n; ++i) {
    big b;
    ssa_decode_stats *st = (ssa_decode_stats *)(void *)b.bytes;
    memset(b.bytes, 0xCD, sizeof b.bytes);
    st->struct_size = (uint32_t)(ss.at[i] >= sizeof full ? sizeof full + 24 : ss.at[i]);
    EXPECT_STATUS(ssa_decode(s, 0, q, got, &p, st), SSA_OK);
    EXPECT(st->struct_size == (ss.at[i] >= sizeof full ? sizeof full + 24 : ss.at[i]));
    EXPECT(memcmp(b.bytes + 8, (const unsigned char *)&full + 8,
                  (ss.at[i] < sizeof full ? ss.at[i] : END(ssa_decode_stats, host_cache_hits)) - 8) == 0);
    if (ss.at[i] < sizeof full) {
      EXPECT(b.bytes[ss.at[i]] == 0xCD); /* beyond the caller's struct: untouched */
    } else {
      size_t j;
      for (j = sizeof full; j < sizeof full + 24; ++j) EXPECT(b.bytes[j] == 0);
      EXPECT(b.bytes[sizeof full + 24] == 0xCD);
    }
  }
  {
    ssa_decode_stats st;
    ssa_decode_stats_init(&st);
    st.struct_size = (uint32_t)offsetof(ssa_decode_stats, unique_samples);
    EXPECT_STATUS(ssa_decode(s, 0, q, got, &p, &st), SSA_ERR_INVALID_ARGUMENT);
    st.struct_size = (uint32_t)inside(offsetof(ssa_decode_stats, scored_tokens), END(ssa_decode_stats, scored_tokens));
    EXPECT_STATUS(ssa_decode(s, 0, q, got, &p, &st), SSA_ERR_INVALID_ARGUMENT);
  }
  /* Enum out of range. */
  p.method = (ssa_method)0xFFFFFFFFu;
  EXPECT_STATUS(ssa_decode(s, 0, q, got, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  p.method = (ssa_method)7;
  EXPECT_STATUS(ssa_decode(s, 0, q, got, &p, NULL), SSA_ERR_INVALID_ARGUMENT);
  {
    ssa_decode_item item;
    item.session = s;
    item.q = q;
    item.out = got;
    EXPECT_STATUS(ssa_decode_batch(&item, 1, 0, &p), SSA_ERR_INVALID_ARGUMENT);
  }
}

/* A budget at or below sink + local on a longer context is reported. */
static void test_window_only(ssa_session *s, const float *q) {
  ssa_decode_params p;
  ssa_decode_stats st;
  float out[NQ * D];
  ssa_decode_params_init(&p); /* N / 50 = 24 tokens, below 128 + 128 */
  ssa_decode_stats_init(&st);
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, &st), SSA_OK);
  EXPECT(st.window_only_heads == NQ);
  EXPECT(st.heavy_tokens == 0 && st.draws == 0 && st.scored_tokens == 0);
  EXPECT(st.tokens_read == (uint64_t)NQ * 256);
  p.method = SSA_METHOD_DENSE; /* dense is exact, not a too-small budget */
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, &st), SSA_OK);
  EXPECT(st.window_only_heads == 0);
  p.method = SSA_METHOD_PQ_TOPK;
  p.budget = 400;
  EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, &st), SSA_OK);
  EXPECT(st.window_only_heads == 0 && st.heavy_tokens == (uint64_t)NQ * 144);
}

static sizes info_sizes(void) {
  sizes s = {0, {0}};
  add(&s, END(ssa_snapshot_info, format_version));
  add(&s, END(ssa_snapshot_info, generation));
  add(&s, END(ssa_snapshot_info, file_bytes));
  add(&s, END(ssa_snapshot_info, live_bytes));
  add(&s, END(ssa_snapshot_info, n_sections));
  add(&s, END(ssa_snapshot_info, n_layers));
  add(&s, END(ssa_snapshot_info, n_q_heads));
  add(&s, END(ssa_snapshot_info, n_kv_heads));
  add(&s, END(ssa_snapshot_info, head_dim));
  add(&s, END(ssa_snapshot_info, kv_dtype));
  add(&s, END(ssa_snapshot_info, pq_subspaces));
  add(&s, END(ssa_snapshot_info, pq_centroids));
  add(&s, END(ssa_snapshot_info, page_tokens));
  add(&s, END(ssa_snapshot_info, indexed_layers));
  add(&s, END(ssa_snapshot_info, model_fingerprint));
  add(&s, END(ssa_snapshot_info, length));
  add(&s, END(ssa_snapshot_info, max_layer_length));
  add(&s, END(ssa_snapshot_info, metadata_bytes));
  add(&s, sizeof(ssa_snapshot_info));
  return s;
}

static void test_snapshot_info(const char *path) {
  const sizes sz = info_sizes();
  ssa_snapshot_info full;
  size_t i;
  ssa_snapshot_info_init(&full);
  EXPECT_STATUS(ssa_snapshot_inspect(path, &full), SSA_OK);
  EXPECT(full.n_q_heads == NQ && full.length == N);
  for (i = 0; i < sz.n; ++i) {
    big b;
    ssa_snapshot_info *info = (ssa_snapshot_info *)(void *)b.bytes;
    const size_t size = sz.at[i] >= sizeof full ? sizeof full + 8 : sz.at[i];
    memset(b.bytes, 0xCD, sizeof b.bytes);
    info->struct_size = (uint32_t)size;
    EXPECT_STATUS(ssa_snapshot_inspect(path, info), SSA_OK);
    EXPECT(memcmp(b.bytes + 4, (const unsigned char *)&full + 4, (size < sizeof full ? size : sizeof full) - 4) == 0);
    EXPECT(b.bytes[size] == 0xCD);
    if (size > sizeof full) EXPECT(b.bytes[sizeof full] == 0);
  }
  {
    ssa_snapshot_info info;
    ssa_snapshot_info_init(&info);
    info.struct_size = 4;
    EXPECT_STATUS(ssa_snapshot_inspect(path, &info), SSA_ERR_INVALID_ARGUMENT);
    info.struct_size = (uint32_t)inside(offsetof(ssa_snapshot_info, generation), END(ssa_snapshot_info, generation));
    EXPECT_STATUS(ssa_snapshot_inspect(path, &info), SSA_ERR_INVALID_ARGUMENT);
  }
}

/* One bound for every versioned struct: a struct_size above SSA_MAX_STRUCT_SIZE
   (no header can produce it) is refused with SSA_ERR_INVALID_ARGUMENT before a
   byte beyond the struct is read or written, for inputs and outputs alike; the
   bound itself is accepted (zero bytes beyond, inputs; zeros written, outputs). */
typedef union huge {
  unsigned char bytes[SSA_MAX_STRUCT_SIZE + 64];
  uint64_t align;
} huge;

static void test_struct_size_bound(ssa_runtime *rt, ssa_session *s, const float *q, const char *path) {
  const uint32_t above[] = {SSA_MAX_STRUCT_SIZE + 1u, SSA_MAX_STRUCT_SIZE + 8u, 0x80000000u, 0xFFFFFFFFu};
  static huge h;
  float out[NQ * D];
  size_t i;
  EXPECT(SSA_MAX_STRUCT_SIZE >= sizeof(ssa_runtime_options) && SSA_MAX_STRUCT_SIZE >= sizeof(ssa_session_config) &&
         SSA_MAX_STRUCT_SIZE >= sizeof(ssa_decode_params) && SSA_MAX_STRUCT_SIZE >= sizeof(ssa_decode_stats) &&
         SSA_MAX_STRUCT_SIZE >= sizeof(ssa_snapshot_info));
  for (i = 0; i <= sizeof above / sizeof above[0]; ++i) {
    /* i == the count: the bound itself, accepted. */
    const int at_bound = i == sizeof above / sizeof above[0];
    const uint32_t size = at_bound ? SSA_MAX_STRUCT_SIZE : above[i];
    const ssa_status want = at_bound ? SSA_OK : SSA_ERR_INVALID_ARGUMENT;
    ssa_runtime *r = NULL;
    ssa_session *made = NULL;
    ssa_decode_item item;
    /* Inputs: the struct, then zeros up to the buffer's end (no byte to refuse
       them by but the size). */
    {
      ssa_runtime_options o;
      ssa_runtime_options_init(&o);
      o.backend = SSA_BACKEND_CPU;
      o.num_threads = 1;
      memset(&h, 0, sizeof h);
      memcpy(h.bytes, &o, sizeof o);
      ((ssa_runtime_options *)(void *)h.bytes)->struct_size = size;
      EXPECT_STATUS(ssa_runtime_create((const ssa_runtime_options *)(void *)h.bytes, &r), want);
      EXPECT((r != NULL) == at_bound);
      ssa_runtime_destroy(r);
    }
    {
      ssa_session_config c = shape();
      memset(&h, 0, sizeof h);
      memcpy(h.bytes, &c, sizeof c);
      ((ssa_session_config *)(void *)h.bytes)->struct_size = size;
      EXPECT_STATUS(ssa_session_create(rt, (const ssa_session_config *)(void *)h.bytes, &made), want);
      EXPECT((made != NULL) == at_bound);
      ssa_session_destroy(made);
      made = NULL;
      EXPECT_STATUS(ssa_session_load_checked(rt, path, 0, (const ssa_session_config *)(void *)h.bytes, &made), want);
      EXPECT((made != NULL) == at_bound);
      ssa_session_destroy(made);
    }
    {
      ssa_decode_params p;
      uint64_t offsets[NQ + 1];
      ssa_decode_params_init(&p);
      p.method = SSA_METHOD_DENSE;
      memset(&h, 0, sizeof h);
      memcpy(h.bytes, &p, sizeof p);
      ((ssa_decode_params *)(void *)h.bytes)->struct_size = size;
      memset(out, 0x5A, sizeof out);
      EXPECT_STATUS(ssa_decode(s, 0, q, out, (const ssa_decode_params *)(void *)h.bytes, NULL), want);
      EXPECT(at_bound || ((const unsigned char *)out)[0] == 0x5A);
      item.session = s;
      item.q = q;
      item.out = out;
      EXPECT_STATUS(ssa_decode_batch(&item, 1, 0, (const ssa_decode_params *)(void *)h.bytes), want);
      EXPECT_STATUS(ssa_decode_traced(s, 0, q, out, (const ssa_decode_params *)(void *)h.bytes, NULL, NULL, NULL, 0,
                                      offsets),
                    at_bound ? SSA_ERR_INVALID_ARGUMENT /* capacity 0 is too small */ : want);
    }
    /* Outputs: the library may write up to the claimed size only when it is
       within the bound; beyond the bound nothing is written at all. */
    {
      ssa_decode_params p;
      ssa_decode_stats *st = (ssa_decode_stats *)(void *)h.bytes;
      uint64_t offsets[NQ + 1];
      ssa_decode_params_init(&p);
      p.method = SSA_METHOD_DENSE;
      memset(&h, 0xCD, sizeof h);
      st->struct_size = size;
      EXPECT_STATUS(ssa_decode(s, 0, q, out, &p, st), want);
      EXPECT(h.bytes[8] == (at_bound ? 0xB0 : 0xCD)); /* context_tokens' low byte: N = 1200 = 0x4B0 */
      EXPECT(h.bytes[SSA_MAX_STRUCT_SIZE - 1] == (at_bound ? 0 : 0xCD));
      EXPECT(h.bytes[SSA_MAX_STRUCT_SIZE] == 0xCD);
      memset(&h, 0xCD, sizeof h);
      st->struct_size = size;
      EXPECT_STATUS(ssa_decode_traced(s, 0, q, out, &p, st, NULL, NULL, 0, offsets), SSA_ERR_INVALID_ARGUMENT);
      EXPECT(h.bytes[8] == 0xCD);
    }
    {
      ssa_session_config *c = (ssa_session_config *)(void *)h.bytes;
      memset(&h, 0xCD, sizeof h);
      c->struct_size = size;
      EXPECT_STATUS(ssa_session_get_config(s, c), want);
      EXPECT(h.bytes[SSA_MAX_STRUCT_SIZE - 1] == (at_bound ? 0 : 0xCD));
      EXPECT(h.bytes[SSA_MAX_STRUCT_SIZE] == 0xCD);
    }
    {
      ssa_snapshot_info *info = (ssa_snapshot_info *)(void *)h.bytes;
      memset(&h, 0xCD, sizeof h);
      info->struct_size = size;
      EXPECT_STATUS(ssa_snapshot_inspect(path, info), want);
      EXPECT(h.bytes[SSA_MAX_STRUCT_SIZE - 1] == (at_bound ? 0 : 0xCD));
      EXPECT(h.bytes[SSA_MAX_STRUCT_SIZE] == 0xCD);
    }
  }
}

int main(void) {
  ssa_runtime_options ro;
  ssa_runtime *rt = NULL;
  ssa_session_config cfg;
  ssa_session *s = NULL;
  float *k, *v, q[NQ * D];
  uint32_t rng = 777u;
  size_t i;
  char path[] = "/tmp/ssa_struct_rules_XXXXXX";
  FILE *f;

  {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", SSA_VERSION_MAJOR, SSA_VERSION_MINOR, SSA_VERSION_PATCH);
    EXPECT(strcmp(ssa_version_string(), want) == 0);
  }
  EXPECT(strcmp(ssa_status_string((ssa_status)0xFFFFFFFFu), "SSA_ERR_UNKNOWN") == 0);
  EXPECT(strcmp(ssa_status_string((ssa_status)11), "SSA_ERR_UNKNOWN") == 0);

  test_runtime_options();
  ssa_runtime_options_init(&ro);
  ro.backend = SSA_BACKEND_CPU;
  ro.num_threads = 2;
  if (ssa_runtime_create(&ro, &rt) != SSA_OK) {
    fprintf(stderr, "runtime: %s\n", ssa_last_error_message());
    return 1;
  }
  {
    int fd = mkstemp(path);
    EXPECT(fd >= 0);
    f = fdopen(fd, "w");
    if (f != NULL) fclose(f);
  }
  cfg = shape();
  EXPECT_STATUS(ssa_session_create(rt, &cfg, &s), SSA_OK);
  k = malloc(sizeof(float) * N * NKV * D);
  v = malloc(sizeof(float) * N * NKV * D);
  if (s == NULL || k == NULL || v == NULL) return 1;
  for (i = 0; i < (size_t)N * NKV * D; ++i) {
    k[i] = frand(&rng);
    v[i] = frand(&rng);
  }
  for (i = 0; i < NQ * D; ++i) q[i] = 2.0f * frand(&rng);
  EXPECT_STATUS(ssa_session_append(s, 0, k, v, N), SSA_OK);
  EXPECT_STATUS(ssa_session_save(s, path), SSA_OK);

  test_decode_structs(s, q);
  test_window_only(s, q);
  test_snapshot_info(path);
  test_session_config(rt, path);
  test_struct_size_bound(rt, s, q, path);

  ssa_session_destroy(s);
  ssa_runtime_destroy(rt);
  free(k);
  free(v);
  remove(path);
  if (failures != 0) {
    fprintf(stderr, "%d expectation(s) failed\n", failures);
    return 1;
  }
  printf("struct-size and enum rules hold for every versioned struct and enum\n");
  return 0;
}
