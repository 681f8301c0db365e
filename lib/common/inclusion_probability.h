// Inclusion probability of a token drawn with probability p in each of m
// independent draws with replacement: pi = 1 - (1 - p)^m, computed without
// cancellation as -expm1(m * log1p(-p)), then clamped below at pi_min so that no
// importance weight exceeds 1 / pi_min (a little bias for bounded variance).
#pragma once

#include <math.h>

#include "host_device.h"

namespace ssa {

SSA_HD double inclusion_probability(double p, double m, double pi_min) {
  double pi;
  if (p >= 1.0) {
    pi = 1.0;
  } else if (p <= 0.0 || m <= 0.0) {
    pi = 0.0;
  } else {
    pi = -expm1(m * log1p(-p));
  }
  if (pi < pi_min) pi = pi_min;
  if (pi > 1.0) pi = 1.0;
  return pi;
}

}  // namespace ssa
