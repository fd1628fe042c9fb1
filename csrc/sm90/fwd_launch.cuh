// Host code that launches the sm90 forward kernels as a plan (sm90/fwd_plan.h) says: the tensor maps,
// the schedule, clusters for K/V multicast. It chooses nothing: an unexpected plan is an error.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/varlen_schedule.h"
#include "params.h"
#include "sm90/fwd_config.h"
#include "sm90/fwd_kernel.cuh"
#include "sm90/fwd_plan.h"
#include "sm90/fwd_producer.cuh"
#include "sm90/fwd_schedule.h"
#include "sm90/tensor_map.h"

namespace flashattn {
namespace sm90 {

// The launch configuration of `grid` CTAs (an even number) in clusters of two; it points to `cluster`.
inline cudaLaunchConfig_t pair_cluster_config(int grid, int threads, int smem_bytes, cudaStream_t stream,
                                              cudaLaunchAttribute* cluster) {
  cluster->id = cudaLaunchAttributeClusterDimension;
  cluster->val.clusterDim.x = 2;
  cluster->val.clusterDim.y = 1;
  cluster->val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = cluster;
  config.numAttrs = 1;
  return config;
}

// One launch of fwd_kernel<T, Cfg, kMasked, kKeyEnds, kMulticast, false, kAlibi> over p (whose shape is
// the plan's).
template <typename T, typename Cfg, bool kMasked, bool kKeyEnds, bool kMulticast, bool kAlibi>
cudaError_t launch_fwd_kernel(const FwdParams& p, const FwdLaunchPlan& plan, cudaStream_t stream) {
  static_assert(!kMulticast || (!kMasked && !kKeyEnds), "multicast runs rows that walk every key block");
  static_assert(!Cfg::kNarrowTail || (!kMasked && !kKeyEnds && !Cfg::kPrefetchScores),
                "a narrow tail: every row walks every key block");
  const AttentionShape& sh = p.shape;
  if ((sh.alibi_slopes != nullptr) != kAlibi) return cudaErrorInvalidValue;  // the form must match the call
  FwdTensorMaps maps;
  // With multicast each CTA loads half of each key block.
  constexpr int kKVBoxRows = Cfg::kBlockN / kFwdClusterCtas<kMulticast>;
  cudaError_t err = make_tensor_map(&maps.q, p.q, sh, sh.seqlen_q, sh.heads_q, p.q_strides, Cfg::kBlockM);
  if (err == cudaSuccess) err = make_tensor_map(&maps.k, p.k, sh, sh.seqlen_k, sh.heads_kv, p.k_strides, kKVBoxRows);
  if (err == cudaSuccess) err = make_tensor_map(&maps.v, p.v, sh, sh.seqlen_k, sh.heads_kv, p.v_strides, kKVBoxRows);
  if (err != cudaSuccess) return err;
  // The staged output's tensor map; the kernel stores from the threads without one (the same kernel).
  const bool staged_output =
      plan.staged_output &&
      make_tensor_map(&maps.out, p.out, sh, sh.seqlen_q, sh.heads_q, p.out_strides, 64) == cudaSuccess;
  const int64_t num_tiles = static_cast<int64_t>((sh.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM) * sh.heads_q * sh.batch;
  if (num_tiles > 0x7fffffff || plan.grid < 1) return cudaErrorInvalidConfiguration;
  constexpr auto kernel = fwd_kernel<T, Cfg, kMasked, kKeyEnds, kMulticast, false, kAlibi>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  if (plan.dynamic_heads > 0) {
    if (p.tile_counter == nullptr) return cudaErrorInvalidValue;
    err = cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream);
    if (err != cudaSuccess) return err;
  }
  const FwdSchedule sched(sh, Cfg::kBlockM, plan.tiles_per_unit, plan.dynamic_heads);
  if constexpr (kMulticast) {
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config = pair_cluster_config(plan.grid, Cfg::kThreads, Cfg::kSmemBytes, stream, &cluster);
    return cudaLaunchKernelEx(&config, kernel, maps, p, sched, staged_output);
  } else {
    kernel<<<plan.grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(maps, p, sched, staged_output);
    return cudaGetLastError();
  }
}

// The variable-length forward at tile width kHeadDim (VarlenFwdConfig): builds the tile list of
// p.varlen (its buffers sized by fwd_varlen_list_capacity) and launches `grid` persistent CTAs over it.
// p.shape is the batch's: batch = sequences, seqlen_q / seqlen_k = the packed row counts. kAlibi: the
// kernel form with ALiBi's term, for calls with sh.alibi_slopes (and only those).
template <typename T, int kHeadDim, bool kAlibi>
cudaError_t launch_fwd_varlen(const FwdParams& p, int grid, cudaStream_t stream) {
  using Cfg = typename VarlenFwdConfig<kHeadDim>::type;
  const AttentionShape& sh = p.shape;
  if (!p.varlen.enabled() || p.tile_counter == nullptr || grid < 1) return cudaErrorInvalidValue;
  if ((sh.alibi_slopes != nullptr) != kAlibi) return cudaErrorInvalidValue;
  VarlenListSpec spec;
  spec.work = VarlenWork::kForward;
  spec.batch = sh.batch;
  spec.heads = sh.heads_q;
  spec.block_rows = Cfg::kBlockM;
  spec.cost_rows = Cfg::kBlockN;
  spec.is_causal = sh.is_causal;
  spec.other_row_bytes = int64_t{2} * sh.head_dim * static_cast<int64_t>(sizeof(T));  // a key row and a value row
  spec.head_group = std::max(sh.heads_q / std::max(sh.heads_kv, 1), 1);
  cudaError_t err = build_varlen_list(p.varlen, spec, reinterpret_cast<int2*>(const_cast<int*>(p.varlen.tiles)),
                                      const_cast<int*>(p.varlen.tile_count), stream);
  if (err != cudaSuccess) return err;
  // The packed tensors as one batch entry of total rows.
  AttentionShape packed = sh;
  packed.batch = 1;
  FwdTensorMaps maps;
  err = make_tensor_map(&maps.q, p.q, packed, sh.seqlen_q, sh.heads_q, p.q_strides, Cfg::kBlockM);
  if (err == cudaSuccess) err = make_tensor_map(&maps.k, p.k, packed, sh.seqlen_k, sh.heads_kv, p.k_strides, Cfg::kBlockN);
  if (err == cudaSuccess) err = make_tensor_map(&maps.v, p.v, packed, sh.seqlen_k, sh.heads_kv, p.v_strides, Cfg::kBlockN);
  if (err != cudaSuccess) return err;
  constexpr auto kernel = fwd_kernel<T, Cfg, false, false, false, true, kAlibi>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  err = cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream);
  if (err != cudaSuccess) return err;
  const FwdSchedule sched(sh, Cfg::kBlockM, 1, 0);  // its dividers only
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(maps, p, sched, false);
  return cudaGetLastError();
}

// The unmasked kernels of a configuration that are compiled (a bit set): every row without multicast,
// the key-length form's rows, every row with K/V multicast.
constexpr unsigned kAllRows = 1, kKeyEndRows = 2, kMulticastRows = 4;

// A launch without an attention mask in configuration Cfg, one of the kernels kBuilt names (in its
// form with ALiBi's term where kAlibi).
template <typename T, typename Cfg, unsigned kBuilt, bool kAlibi>
cudaError_t launch_fwd_unmasked(const FwdParams& p, const FwdLaunchPlan& plan, cudaStream_t stream) {
  if (plan.rows == FwdRows::kKeyEnds) {
    if constexpr ((kBuilt & kKeyEndRows) != 0) {
      if (!plan.multicast) return launch_fwd_kernel<T, Cfg, false, true, false, kAlibi>(p, plan, stream);
    }
    return cudaErrorInvalidValue;
  }
  if (plan.multicast) {
    if constexpr ((kBuilt & kMulticastRows) != 0) {
      return launch_fwd_kernel<T, Cfg, false, false, true, kAlibi>(p, plan, stream);
    }
    return cudaErrorInvalidValue;
  }
  if constexpr ((kBuilt & kAllRows) != 0) {
    return launch_fwd_kernel<T, Cfg, false, false, false, kAlibi>(p, plan, stream);
  }
  return cudaErrorInvalidValue;
}

// The unmasked launches at tile width kHeadDim: the configurations and kernels compiled there
// (fwd_plan.cu chooses among them), each in its form with ALiBi's term where kAlibi. Instantiated per
// (T, kHeadDim, kAlibi) in csrc/instantiations/.
template <typename T, int kHeadDim, bool kAlibi>
cudaError_t launch_fwd(const FwdParams& p, const FwdLaunchPlan& plan, cudaStream_t stream) {
  if (plan.width != kHeadDim || plan.rows == FwdRows::kMasked) return cudaErrorInvalidValue;
  using Default = typename DefaultFwdConfig<kHeadDim>::type;
  if constexpr (kHeadDim == 64) {
    switch (plan.tiles) {
      case FwdTiles::kLongRows:
        return launch_fwd_unmasked<T, typename LongRowFwdConfig<64>::type, kAllRows | kKeyEndRows, kAlibi>(p, plan,
                                                                                                       stream);
      case FwdTiles::kPrefetchScores:
        return launch_fwd_unmasked<T, typename PrefetchScoresFwdConfig<64>::type, kAllRows, kAlibi>(p, plan, stream);
      case FwdTiles::kDefault:  // the key-length form's rows, which can end before a second key block
        return launch_fwd_unmasked<T, Default, kKeyEndRows, kAlibi>(p, plan, stream);
      default:
        return cudaErrorInvalidValue;
    }
  } else if constexpr (kHeadDim == 128) {
    switch (plan.tiles) {
      case FwdTiles::kDefault:
        return launch_fwd_unmasked<T, Default, kAllRows | kKeyEndRows | kMulticastRows, kAlibi>(p, plan, stream);
      case FwdTiles::kWideKeys:
        return launch_fwd_unmasked<T, typename WideKeyFwdConfig<128>::type, kAllRows | kMulticastRows, kAlibi>(p, plan,
                                                                                                          stream);
      case FwdTiles::kWideKeysTail64:
        return launch_fwd_unmasked<T, typename WideKeyTailFwdConfig<128, 64>::type, kAllRows | kMulticastRows, kAlibi>(
            p, plan, stream);
      case FwdTiles::kWideKeysTail128:
        return launch_fwd_unmasked<T, typename WideKeyTailFwdConfig<128, 128>::type, kAllRows | kMulticastRows, kAlibi>(
            p, plan, stream);
      default:
        return cudaErrorInvalidValue;
    }
  } else {
    if (plan.tiles != FwdTiles::kDefault) return cudaErrorInvalidValue;
    return launch_fwd_unmasked<T, Default, kAllRows | kKeyEndRows, kAlibi>(p, plan, stream);
  }
}

// The masked launch at tile width kHeadDim (masks and dropout).
template <typename T, int kHeadDim, bool kAlibi>
cudaError_t launch_fwd_masked(const FwdParams& p, const FwdLaunchPlan& plan, cudaStream_t stream) {
  if (plan.width != kHeadDim || plan.rows != FwdRows::kMasked || plan.tiles != FwdTiles::kMasked || plan.multicast) {
    return cudaErrorInvalidValue;
  }
  return launch_fwd_kernel<T, typename MaskedFwdConfig<kHeadDim>::type, true, false, false, kAlibi>(p, plan, stream);
}

}  // namespace sm90
}  // namespace flashattn
