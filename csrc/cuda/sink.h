// Attention sinks in the forward kernels' epilogues (FwdParams::sink): one more term of a row's
// softmax denominator, exp(sink), with no value row.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "params.h"

namespace flashattn {

// Query head `head`'s sink in base-2 units (sink * log2 e), or -inf (no term) without sinks.
__device__ __forceinline__ float sink_log2_of(const FwdParams& p, int head) {
  return p.sink == nullptr ? -INFINITY : p.sink[head] * 1.4426950408889634f;
}

// Adds the sink's term to a row's softmax total: `base` (base-2 units: the value its exponentials are
// relative to; -inf for a row that saw no key) and `sum` (of exp2(score - base)) become those of the
// row with exp2(sink_log2 - base) added. The base moves up to the sink when the sink is larger, so that
// nothing overflows; the row's unnormalized output, still relative to the old base, must be scaled by
// the returned factor (0 for a row that saw no key: its output stays 0 and its LSE becomes the sink).
// A sink of -inf changes nothing; a NaN in the row stays NaN.
__device__ __forceinline__ float join_sink(float sink_log2, float& base, float& sum) {
  const float joined = fmaxf(base, sink_log2);
  if (joined == -INFINITY) return 1.f;
  const float factor = exp2f(base - joined);
  sum = fmaf(sum, factor, exp2f(sink_log2 - joined));
  base = joined;
  return factor;
}

}  // namespace flashattn
