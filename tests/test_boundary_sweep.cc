// The boundary sweep (tests/support/boundary_sweep.h) on the CPU backend: every
// method x dtype x head dim x GQA ratio, lengths from 1 token through a page, the
// window and the index threshold, budgets around each boundary, against float64
// references (the proxy methods through their traced read sets).
#include <doctest/doctest.h>

#include "support/boundary_sweep.h"

namespace {

using namespace ssa_test;
using namespace ssa_test::sweep;

Io cpu_io(ssa_runtime* rt) {
  Io io;
  io.name = "cpu";
  io.rt = rt;
  io.traced = true;
  io.append = [](ssa_session* s, const std::vector<uint8_t>& k, const std::vector<uint8_t>& v, uint64_t n,
                 bool async) {
    return async ? ssa_session_append_async(s, 0, k.data(), v.data(), n, nullptr)
                 : ssa_session_append(s, 0, k.data(), v.data(), n);
  };
  io.decode = [](ssa_session* s, const std::vector<uint8_t>& q, std::vector<uint8_t>* out,
                 const ssa_decode_params& p, ssa_decode_stats* st) {
    return ssa_decode(s, 0, q.data(), out->data(), &p, st);
  };
  io.decode_batch = [](const std::vector<ssa_session*>& ss, const std::vector<uint8_t>& q,
                       std::vector<std::vector<uint8_t>>* outs, const ssa_decode_params& p) {
    outs->assign(ss.size(), std::vector<uint8_t>(q.size()));
    std::vector<ssa_decode_item> items;
    for (size_t i = 0; i < ss.size(); ++i) items.push_back(ssa_decode_item{ss[i], q.data(), (*outs)[i].data()});
    return ssa_decode_batch(items.data(), items.size(), 0, &p);
  };
  return io;
}

TEST_CASE("boundary sweep (CPU): short contexts, windows, index threshold and budget edges") {
  RuntimePtr rt = make_runtime(2, 99);
  const Io io = cpu_io(rt.get());
  Tally total;
  uint64_t seed = 1;
  for (const Shape& sh : sweep_shapes()) {
    total += run_shape(io, sh, 600, seed++);
}
  report("cpu", total);
  CHECK(total.window_only > 0);
  CHECK(total.traced > 0);
  CHECK(total.oracle > 0);
}

}  // namespace
