#include "group_index.h"

#include <string.h>

#include <algorithm>
#include <mutex>
#include <new>

#include "group_call_check.h"
#include "index/pq_index.h"
#include "index/query_transform.h"
#include "shard_map.h"
#include "status.h"

namespace ssa {
namespace {

constexpr uint64_t kGatherKeys = 1024;  // sample keys per rank per all-gather

}  // namespace

absl::Status gather_sample_keys(ProcessGroup& g, const KvLayout& layout, uint64_t n_tokens, uint64_t shard_tokens,
                                uint64_t n, SampleKeyReader read, std::vector<float>* keys) {
  const uint32_t R = g.size(), H = layout.n_kv_heads, d = layout.head_dim;
  const uint64_t N = n_tokens;
  // Every rank's part of the sample: the keys of its tokens, a run [i0, i1) of
  // sample indices (sample_token increases with i), the runs in rank order.
  std::vector<uint64_t> i0(R), i1(R);
  uint64_t most = 0;
  for (uint32_t r = 0; r < R; ++r) {
    const HeldRange h = held_tokens(r, R, shard_tokens);
    i0[r] = first_sample_at(h.begin, N, n);
    i1[r] = first_sample_at(h.end, N, n);
    most = std::max(most, i1[r] - i0[r]);
  }
  const uint64_t rounds = (most + kGatherKeys - 1) / kGatherKeys;
  const size_t block = size_t{H} * kGatherKeys * d;  // floats of one rank's part of a round
  std::vector<float> send, recv;
  try {
    keys->assign(size_t{H} * n * d, 0.0f);
    send.resize(block);
    recv.resize(block * R);
  } catch (const std::bad_alloc&) {
    // Peers go on to the gathers this rank will not make: they time out.
    g.mark_out_of_step();
    return make_error(SSA_ERR_OUT_OF_MEMORY, "out of memory for the index training sample of a group");
  }
  const uint32_t me = g.rank();
  for (uint64_t k = 0; k < rounds; ++k) {
    const uint64_t a = std::min(i1[me], i0[me] + k * kGatherKeys), b = std::min(i1[me], a + kGatherKeys);
    if (a < b) {
      const absl::Status st = read(a, b, send.data());
      if (!st.ok()) {
        g.mark_out_of_step();  // peers wait at the gather this rank will not make
        return st;
      }
    }
    SSA_RETURN_IF_ERROR(g.all_gather(send.data(), block * sizeof(float), recv.data()));
    for (uint32_t r = 0; r < R; ++r) {
      const uint64_t ra = std::min(i1[r], i0[r] + k * kGatherKeys), rb = std::min(i1[r], ra + kGatherKeys);
      const uint64_t c = rb - ra;
      const float* part = recv.data() + size_t{r} * block;  // [H][c][d]
      for (uint32_t h = 0; h < H; ++h) {
        for (uint64_t j = 0; j < c; ++j) {
          memcpy(keys->data() + (size_t{h} * n + ra + j) * d, part + (size_t{h} * c + j) * d, d * sizeof(float));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status group_train(ProcessGroup& g, uint32_t layer_index, const LayerStore& layer,
                         const ssa_session_config& cfg, const absl::Status& before,
                         absl::FunctionRef<absl::Status()> train) {
  static const char* const kNames[kSummaryFields] = {
      "layer", "layer length (every rank must append the same rows)", "PQ index (trained at another length)",
      "index_train_sample", "index_iterations", "proxy",
      "observed queries (every rank must observe the same queries)", "pq_parallel_weight"};
  std::lock_guard<std::mutex> lock(g.call_mutex());
  CallSummary mine;
  mine.kind = static_cast<uint64_t>(GroupCall::kTrain);
  mine.field[0] = layer_index;
  mine.field[1] = layer.n_tokens;
  mine.field[2] = layer.codebooks != nullptr ? layer.trained_at_tokens : 0;
  mine.field[3] = cfg.index_train_sample;
  mine.field[4] = cfg.index_iterations;
  mine.field[5] = static_cast<uint64_t>(cfg.proxy);
  mine.field[6] = query_moments_hash(layer.query_moments.get());
  uint32_t weight_bits;
  memcpy(&weight_bits, &cfg.pq_parallel_weight, sizeof weight_bits);
  mine.field[7] = weight_bits;
  SSA_RETURN_IF_ERROR(begin_call(g, mine, before, kNames));
  absl::Status st;
  try {
    st = train();
  } catch (const std::bad_alloc&) {
    st = make_error(SSA_ERR_OUT_OF_MEMORY, "out of memory training a layer's index");
  }
  // An exchange of the training failed (the group refuses every call now): its error.
  if (g.out_of_step()) return st.ok() ? make_error(SSA_ERR_IO, "the group went out of step") : st;
  return agree(g, st, "index training");
}

}  // namespace ssa
