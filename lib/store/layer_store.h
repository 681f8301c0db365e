// The KV store of one layer: a list of pages, the PQ codes beside them and the
// codebooks the codes were made with. Copying a LayerStore copies references only.
#pragma once

#include <stdint.h>

#include <vector>

#include "page.h"
#include "pq_codebooks.h"
#include "query_moments.h"

namespace ssa {

struct LayerStore {
  uint64_t n_tokens = 0;
  std::vector<PageRef> kv_pages;    // layout.pages_for(n_tokens) pages
  std::vector<PageRef> code_pages;  // same count when codebooks is set, else empty
  CodebooksRef codebooks;           // null until the index is first trained
  uint64_t trained_at_tokens = 0;   // layer length when codebooks were trained
  QueryMomentsRef query_moments;    // queries observed (query-aware proxies), or null
};

}  // namespace ssa
