#include "proposal_pass.h"

#include <math.h>

#include <algorithm>

#include "common/fixed_weight.h"
#include "common/sampling_hierarchy.h"
#include "cpu/simd.h"
#include "radix_topk.h"

namespace ssa {

float summarize_blocks(const float* x, size_t n, BlockSummary* out) {
  const auto& kern = simd::kernels();
  const size_t whole = n / kBlockTokens, count = whole + (n % kBlockTokens != 0 ? 1 : 0);
  out->maxima.resize(count);
  out->sample.resize(count);
  float all = whole > 0 ? kern.block_max(x, whole, out->maxima.data(), out->sample.data()) : -INFINITY;
  if (count > whole) {
    const float* tail = x + whole * kBlockTokens;
    out->maxima[whole] = kern.max_value(tail, n % kBlockTokens);
    out->sample[whole] = tail[0];
    all = std::max(all, out->maxima[whole]);
  }
  return all;
}

namespace {

// The r-th largest of x (0 < r <= x.size()).
float rth_largest(const std::vector<float>& x, size_t r, std::vector<uint32_t>* scratch) {
  scratch->clear();
  topk_indices(x.data(), x.size(), r, 0, scratch);
  float t = INFINITY;
  for (uint32_t i : *scratch) t = std::min(t, x[i]);
  return t;
}

}  // namespace

float heavy_threshold(const BlockSummary& blocks, size_t k, std::vector<uint32_t>* scratch) {
  const size_t count = blocks.maxima.size();
  // The sample holds one score in 32: the r-th largest of it is reached by about
  // 32 r scores. Aim at 1.2 k, and four standard deviations of a binomial count
  // above that.
  const double expect = static_cast<double>(k) / kBlockTokens;
  const size_t r = static_cast<size_t>(ceil(1.2 * expect + 4.0 * sqrt(expect))) + 1;
  const float by_sample = r <= count ? rth_largest(blocks.sample, r, scratch) : -INFINITY;
  if (k > count) return by_sample;
  // The k-th largest maximum is the larger only if k maxima reach the sample's:
  // counting them is cheaper than selecting it.
  size_t reach = 0;
  for (float m : blocks.maxima) reach += m >= by_sample ? 1 : 0;
  return reach < k ? by_sample : rth_largest(blocks.maxima, k, scratch);
}

namespace {

// A partial block (the first or the last, cut by the candidates' ends): its
// weights through a padded block of 32, so that every weight takes the
// kernel's vector path as proposal_weights' do (a lane's value does not depend
// on its place).
uint64_t partial_block(const float* x, size_t count, float shift, float threshold, size_t cap,
                       uint32_t index_base, float* w, ProposalPass* out) {
  uint64_t sum = 0;
  if (w != nullptr) {
    float xin[kBlockTokens], e[kBlockTokens];
    std::fill(xin, xin + kBlockTokens, shift);
    std::copy(x, x + count, xin);
    simd::kernels().exp_shifted(xin, shift, e, kBlockTokens, nullptr);
    for (size_t i = 0; i < count; ++i) {
      w[i] = e[i];
      sum += fixed_weight(w[i]);
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (x[i] >= threshold) {
      if (out->n_above < cap) out->above.push_back(index_base + static_cast<uint32_t>(i));
      ++out->n_above;
    }
  }
  return sum;
}

}  // namespace

void proposal_pass(const float* x, size_t n, uint64_t first, float shift, float threshold, size_t cap, float* w,
                   ProposalPass* out) {
  out->above.clear();
  out->n_above = 0;
  out->total = 0;
  out->blocks.clear();
  if (n == 0) return;
  const bool weights = w != nullptr;
  const uint64_t b0 = first / kBlockTokens, b1 = (first + n - 1) / kBlockTokens + 1;
  if (weights) out->blocks.assign(b1 - b0, 0);
  // Candidates before the first whole block, the whole blocks, the rest.
  const size_t head = std::min<size_t>(n, (kBlockTokens - first % kBlockTokens) % kBlockTokens);
  const size_t whole = (n - head) / kBlockTokens, tail = n - head - whole * kBlockTokens;
  if (head > 0) {
    const uint64_t s = partial_block(x, head, shift, threshold, cap, 0, w, out);
    if (weights) out->blocks[0] = s;
  }
  if (whole > 0) {
    // The kernel stores at most the room left; it counts every index.
    const size_t room = cap > out->n_above ? cap - out->n_above : 0;
    const size_t have = out->above.size();
    out->above.resize(have + room);
    const size_t n_whole = simd::kernels().proposal_blocks(
        x + head, whole, shift, threshold, weights ? w + head : nullptr,
        weights ? out->blocks.data() + (head > 0 ? 1 : 0) : nullptr, out->above.data() + have, room,
        static_cast<uint32_t>(head));
    out->above.resize(have + std::min(n_whole, room));
    out->n_above += n_whole;
  }
  if (tail > 0) {
    const size_t i0 = head + whole * kBlockTokens;
    const uint64_t s = partial_block(x + i0, tail, shift, threshold, cap, static_cast<uint32_t>(i0),
                                     weights ? w + i0 : nullptr, out);
    if (weights) out->blocks.back() = s;
  }
  for (uint64_t b : out->blocks) out->total += b;
}

}  // namespace ssa
