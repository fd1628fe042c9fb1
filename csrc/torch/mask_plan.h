// An attention mask as one call's kernels read it: its MaskParams (strides, tile classes) and its
// key-length form, computed once per call on the call's stream, as the plan's MaskPolicy says.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <optional>

#include "params.h"
#include "plan.h"
#include "torch/checks.h"

namespace flashattn {

struct MaskPlan {
  MaskParams params;
  // The key-length form (FwdParams::key_end, BwdParams::key_end), when the policy asks for one.
  const int* key_end = nullptr;           // [B * Hq]: >= 0 a key prefix's length, -1 the masked kernel's row
  const int* masked_rows = nullptr;       // [B * Hq]: the rows with -1, the first *masked_row_count of them
  const int* masked_row_count = nullptr;  // [1]
  bool key_end_causal = false;
  // Device memory the above point into; the caching allocator keeps it for the stream's later work
  // even once these are freed, so they need only live until the launches are queued.
  at::Tensor classes, key_rows;
};

// The distinct (batch, head) slices of a mask along its batch and head dims: 1 along a broadcast dim
// (stride 0, or size 1), else the dim's size.
int64_t distinct_batches(const at::Tensor& mask, const CheckedShape& s);
int64_t distinct_heads(const at::Tensor& mask, const CheckedShape& s);

// What the planner reads of a mask's layout (a checked [B, Hq, Lq, Lk] view).
MaskLayout mask_layout(const std::optional<at::Tensor>& mask);

// Runs the mask's prepasses that `policy` asks for, on `stream`: the key-length form first (from the
// mask's strides alone), then the tile classes on policy.tile's grid, leaving out the causal form's
// slices (no masked kernel reads them).
MaskPlan build_mask_plan(const at::Tensor& mask, const CheckedShape& s, ElementType element_type,
                         const MaskPolicy& policy, cudaStream_t stream);

}  // namespace flashattn
