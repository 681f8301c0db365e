// Exact attention over rows of the paged store, as online-softmax partials that
// merge by log-sum-exp (common/online_softmax.h). Dense decode runs attend_range
// over fixed splits of the context; sparse decode runs attend_range over sink and
// local rows and attend_group_entries over the selected rows, each logit lowered
// by log(pi) (Horvitz-Thompson weights w / pi).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "store/kv_layout.h"
#include "store/layer_store.h"

namespace ssa {

struct AttnPartial {
  float m = -__builtin_inff();  // running max logit
  float l = 0.0f;               // sum of exp(logit - m)
  std::vector<float> acc;       // sum of exp(logit - m) * v

  void reset(uint32_t head_dim) {
    m = -__builtin_inff();
    l = 0.0f;
    acc.assign(head_dim, 0.0f);
  }
  void merge(const AttnPartial& other);
  // out = acc / l (zeros if nothing was accumulated).
  void finish(float* out) const;
};

// Tokens [t0, t1) of `kv_head`, for the g query heads q[g][head_dim] (already
// multiplied by 1/sqrt(head_dim)), into parts[0..g).
void attend_range(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head,
                  const float* q, uint32_t g, uint64_t t0, uint64_t t1, AttnPartial* parts);

// One selected row of a KV group: which query head (0..g-1 within the group)
// selected `token`, with what log inclusion probability.
struct GroupEntry {
  uint32_t token;
  uint32_t head;
  float log_pi;
};

// Entries sorted by token (then head) of the g query heads q[g][head_dim]: each
// distinct row is fetched from memory once and serves every head of the group
// that selected it; the sorted order also turns random gathers into a forward
// sweep through the pages.
void attend_group_entries(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head,
                          const float* q, uint32_t g, const GroupEntry* entries, size_t n,
                          AttnPartial* parts);

// Rows read once for all g query heads of a group with one shared log inclusion
// probability each (selection per KV group): tokens[n] in increasing order,
// gathered in blocks and folded into the g heads' states like attend_range.
void attend_shared_rows(const KvLayout& layout, const LayerStore& layer, uint32_t kv_head,
                        const float* q, uint32_t g, const uint32_t* tokens, const float* log_pi,
                        size_t n, AttnPartial* parts);

}  // namespace ssa
