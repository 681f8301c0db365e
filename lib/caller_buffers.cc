#include "caller_buffers.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "status.h"

namespace ssa {
namespace {

std::string describe(const CallerBuffer& b) {
  return b.item == SIZE_MAX ? std::string(b.name) : absl::StrCat(b.name, " of item ", b.item);
}

}  // namespace

absl::Status check_no_overlap(std::vector<CallerBuffer> buffers) {
  struct Span {
    uintptr_t begin, end;
    const CallerBuffer* buffer;
  };
  std::vector<Span> spans;
  spans.reserve(buffers.size());
  for (const CallerBuffer& b : buffers) {
    if (b.p == nullptr || b.bytes == 0) continue;
    const auto begin = reinterpret_cast<uintptr_t>(b.p);
    // A buffer reaching past the end of the address space ends there.
    const uintptr_t end = b.bytes > UINTPTR_MAX - begin ? UINTPTR_MAX : begin + b.bytes;
    spans.push_back(Span{begin, end, &b});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  // Sweeping by start address: a span overlaps an earlier one exactly when it
  // starts before the end of the furthest-reaching earlier span (of any kind
  // for a written span, of written ones for a read span).
  const Span* reach_any = nullptr;
  const Span* reach_written = nullptr;
  for (const Span& c : spans) {
    const Span* hit = c.buffer->written ? reach_any : reach_written;
    if (hit != nullptr && c.begin < hit->end) {
      const CallerBuffer& w = c.buffer->written ? *c.buffer : *hit->buffer;
      const CallerBuffer& other = c.buffer->written ? *hit->buffer : *c.buffer;
      return invalid_argument(describe(w), " overlaps ", describe(other),
                              " (a buffer the call writes may not share memory with another one)");
    }
    if (reach_any == nullptr || c.end > reach_any->end) reach_any = &c;
    if (c.buffer->written && (reach_written == nullptr || c.end > reach_written->end)) reach_written = &c;
  }
  return absl::OkStatus();
}

}  // namespace ssa
