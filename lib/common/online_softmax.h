// Online softmax state and its log-sum-exp merge. A partial attention result over
// a subset of tokens is (max logit m, sum of exp(logit - m) l, and the weighted sum
// of values acc). Partials over disjoint subsets merge exactly, in any order,
// which lets a head be split over threads or thread blocks.
#pragma once

#include <math.h>

#include "host_device.h"

namespace ssa {

struct SoftmaxScale {
  float m;  // running max logit (-INFINITY when empty)
  float l;  // sum of exp(logit - m)
};

// Rescale factors for merging partial b into partial a: new_m = max(a.m, b.m),
// a.acc *= fa, b.acc *= fb, l = a.l * fa + b.l * fb.
SSA_HD SoftmaxScale lse_merge(SoftmaxScale a, SoftmaxScale b, float* fa, float* fb) {
  if (b.m == -INFINITY) {
    *fa = 1.0f;
    *fb = 0.0f;
    return a;
  }
  if (a.m == -INFINITY) {
    *fa = 0.0f;
    *fb = 1.0f;
    return b;
  }
  const float m = a.m > b.m ? a.m : b.m;
  *fa = expf(a.m - m);
  *fb = expf(b.m - m);
  return SoftmaxScale{m, a.l * *fa + b.l * *fb};
}

}  // namespace ssa
