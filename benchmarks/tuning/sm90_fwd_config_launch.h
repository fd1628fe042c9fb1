// One sm90 forward launch in a given configuration, every row, no mask: for timing configurations the
// planner does not choose (tune.py). The schedule is the planner's rule for such a launch: pairs of
// query tiles under causal masking when the tiles do not fit in one wave, no dynamic tail, no multicast.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "sm90/fwd_launch.cuh"

template <typename T, typename Cfg>
cudaError_t launch_sm90_fwd_config(const flashattn::FwdParams& p, cudaStream_t stream) {
  using namespace flashattn::sm90;
  const flashattn::AttentionShape& sh = p.shape;
  int device = 0, num_sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  FwdLaunchPlan plan;
  plan.shape = sh;
  plan.width = Cfg::kHeadDim;
  plan.rows = FwdRows::kAll;
  plan.staged_output = Cfg::kStagedOutput;
  const int num_m = (sh.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t num_tiles = static_cast<int64_t>(num_m) * sh.heads_q * sh.batch;
  plan.tiles_per_unit = num_tiles > num_sms && sh.is_causal ? 2 : 1;
  const int64_t units = (plan.tiles_per_unit == 2 ? (num_m + 1) / 2 : num_m) * static_cast<int64_t>(sh.heads_q) * sh.batch;
  plan.grid = static_cast<int>(std::min<int64_t>(units, num_sms));
  return launch_fwd_kernel<T, Cfg, false, false, false>(p, plan, stream);
}
