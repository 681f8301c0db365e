// The group object every rank of a group of processes uses
// (lib/shard/callback_collective.h), over a transport other than the caller's
// callbacks (the NCCL communicator's goes through ProcessGroup::over): rank and
// size are the transport's, a failed exchange is SSA_ERR_IO naming the
// transport and leaves the group refusing every later exchange without calling
// the transport, and transports of no rank, too many ranks or a rank past the
// size are refused. Also the margin a CUDA rank keeps (lib/shard/group_margin.h).
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "shard/callback_collective.h"
#include "shard/group_margin.h"
#include "shard/shard_map.h"
#include "status.h"

namespace {

// A transport of `size` ranks that sums, maximises and gathers its own data as
// if every rank passed the same, and fails its `fail_at`-th call.
class FakeTransport final : public ssa::Collective {
 public:
  FakeTransport(uint32_t rank, uint32_t size, int fail_at, int* calls)
      : rank_(rank), size_(size), fail_at_(fail_at), calls_(calls) {}
  uint32_t rank() const override { return rank_; }
  uint32_t size() const override { return size_; }
  absl::Status all_reduce_sum(uint64_t* data, size_t n) override {
    SSA_RETURN_IF_ERROR(step());
    for (size_t i = 0; i < n; ++i) data[i] *= size_;
    return absl::OkStatus();
  }
  absl::Status all_reduce_max(float*, size_t) override { return step(); }
  absl::Status all_gather(const void* send, size_t bytes, void* recv) override {
    SSA_RETURN_IF_ERROR(step());
    for (uint32_t r = 0; r < size_; ++r) memcpy(static_cast<uint8_t*>(recv) + r * bytes, send, bytes);
    return absl::OkStatus();
  }

 private:
  absl::Status step() {
    if (++*calls_ == fail_at_) return absl::DeadlineExceededError("peer gone");
    return absl::OkStatus();
  }
  const uint32_t rank_, size_;
  const int fail_at_;
  int* calls_;
};

}  // namespace

TEST_CASE("group over another transport: its rank and size, SSA_ERR_IO then out of step") {
  int calls = 0;
  auto made = ssa::ProcessGroup::over(std::make_unique<FakeTransport>(2, 3, 3, &calls), 1234, "test transport");
  REQUIRE(made.ok());
  ssa::ProcessGroup& g = **made;
  CHECK(g.rank() == 2);
  CHECK(g.size() == 3);
  CHECK(g.timeout_ms() == 1234);
  CHECK_FALSE(g.takes_device_buffers());
  uint64_t v[2] = {5, 7};
  REQUIRE(g.all_reduce_sum(v, 2).ok());
  CHECK(v[0] == 15);
  CHECK(v[1] == 21);
  const uint32_t mine = 9;
  std::vector<uint32_t> all(3);
  REQUIRE(g.all_gather(&mine, sizeof mine, all.data()).ok());
  CHECK(all == std::vector<uint32_t>{9, 9, 9});
  // The third call fails: SSA_ERR_IO naming the transport, its message and the timeout.
  const absl::Status failed = g.all_gather(&mine, sizeof mine, all.data());
  CHECK(ssa::status_code(failed) == SSA_ERR_IO);
  const std::string msg(failed.message());
  CHECK(msg.find("test transport") != std::string::npos);
  CHECK(msg.find("peer gone") != std::string::npos);
  CHECK(msg.find("1234") != std::string::npos);
  CHECK(g.out_of_step());
  // Later calls are refused without reaching the transport.
  float f = 1.0f;
  CHECK(ssa::status_code(g.all_reduce_max(&f, 1)) == SSA_ERR_IO);
  CHECK(ssa::status_code(g.all_reduce_sum(v, 2)) == SSA_ERR_IO);
  CHECK(calls == 3);
}

TEST_CASE("group over another transport: transports of no rank, too many, or a rank past the size are refused") {
  int calls = 0;
  CHECK(ssa::status_code(ssa::ProcessGroup::over(std::make_unique<FakeTransport>(0, 0, 0, &calls), 1, "t").status()) ==
        SSA_ERR_UNSUPPORTED);
  CHECK(ssa::status_code(ssa::ProcessGroup::over(std::make_unique<FakeTransport>(0, 65, 0, &calls), 1, "t").status()) ==
        SSA_ERR_UNSUPPORTED);
  CHECK(ssa::status_code(ssa::ProcessGroup::over(std::make_unique<FakeTransport>(3, 3, 0, &calls), 1, "t").status()) ==
        SSA_ERR_INVALID_ARGUMENT);
  CHECK(ssa::status_code(ssa::ProcessGroup::over(nullptr, 1, "t").status()) == SSA_ERR_INTERNAL);
  CHECK(calls == 0);
}

TEST_CASE("a CUDA rank keeps its shard and the next shard's first 1024 tokens; the last rank all after its start") {
  const uint64_t B = 8192;
  for (uint32_t n = 1; n <= 4; ++n) {
    for (uint32_t r = 0; r < n; ++r) {
      const ssa::HeldRange own = ssa::held_tokens(r, n, B), kept = ssa::held_with_margin(r, n, B);
      CHECK(kept.begin == own.begin);
      if (r + 1 == n) {
        CHECK(kept.end == UINT64_MAX);
      } else {
        CHECK(kept.end == own.end + ssa::kGroupMarginTokens);
        // Every chunk-aligned range of this rank ends inside what it keeps, for
        // every sink count inside the first shard and every length.
        for (uint64_t sink : {0u, 4u, 100u, 128u, 1000u, 5000u, 8191u}) {
          for (uint64_t len : {B * r + 1, B * (r + 1) - 1, B * (r + 1), B * (r + 1) + 700, B * (r + 1) + 1023,
                               B * (r + 1) + 5000, B * n + 3000}) {
            const std::vector<ssa::ShardRange> ranges = ssa::chunk_aligned_ranges(len, n, B, sink, 1024);
            if (ranges[r].size() == 0) continue;
            CHECK(ranges[r].end <= kept.end);
            CHECK(ranges[r].begin >= own.begin);
          }
        }
      }
    }
  }
}
