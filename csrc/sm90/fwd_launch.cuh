// Host code that launches the sm90 forward kernels: tensor maps, the persistent grid and its
// schedule, clusters for K/V multicast, and the choice of configuration per launch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "common/env_switch.h"
#include "params.h"
#include "sm90/fwd_config.h"
#include "sm90/fwd_kernel.cuh"
#include "sm90/fwd_producer.cuh"
#include "sm90/fwd_schedule.h"
#include "sm90/tensor_map.h"

namespace flashattn {
namespace sm90 {

// Whether a launch can run with K/V multicast (see kMulticast): no causal masking, no attention mask
// or key ends (the caller's variant), and query tiles that pair up within each row.
template <typename Cfg>
inline bool multicast_fits(const AttentionShape& sh) {
  const int num_m = (sh.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  return !sh.is_causal && num_m % 2 == 0;
}

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

// How many clusters of two CTAs of kKernel can be resident at once on `device` (0: none, or the query
// failed), asked once per kernel and device. The kernel's dynamic shared memory limit must be set first.
template <auto kKernel>
inline int max_resident_clusters(int threads, int smem_bytes, int device) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cache[kCachedDevices] = {};  // count + 1; 0: not asked yet
  if (device < kCachedDevices && cache[device].load(std::memory_order_relaxed) > 0) return cache[device] - 1;
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t config = pair_cluster_config(2, threads, smem_bytes, nullptr, &cluster);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  if (device < kCachedDevices) cache[device] = clusters + 1;
  return clusters;
}

// Whether a launch's rows end in a block that configuration Cfg's narrow tail covers (see kTailBlockN):
// no causal masking, at least one full key block, then 1 .. kTailBlockN keys.
template <typename Cfg>
inline bool narrow_tail_fits(const AttentionShape& sh) {
  const int tail = sh.seqlen_k % Cfg::kBlockN;
  return !sh.is_causal && sh.seqlen_k > Cfg::kBlockN && tail > 0 && tail <= Cfg::kTailBlockN;
}

template <typename T, typename Cfg, bool kMasked = false, bool kKeyEnds = false, bool kMulticast = false>
cudaError_t launch_fwd_with_config(const FwdParams& p, cudaStream_t stream) {
  static_assert(!kMulticast || (!kMasked && !kKeyEnds), "multicast runs rows that walk every key block");
  static_assert(!Cfg::kNarrowTail || (!kMasked && !kKeyEnds && !Cfg::kPrefetchScores),
                "a narrow tail: every row walks every key block, Q from shared memory");
  const AttentionShape& sh = p.shape;
  if constexpr (Cfg::kNarrowTail) {
    if (!narrow_tail_fits<Cfg>(sh)) return cudaErrorInvalidConfiguration;
  }
  FwdTensorMaps maps;
  // With multicast each CTA loads half of each key block.
  constexpr int kKVBoxRows = Cfg::kBlockN / kFwdClusterCtas<kMulticast>;
  cudaError_t err = make_tensor_map(&maps.q, p.q, sh, sh.seqlen_q, sh.heads_q, p.q_strides, Cfg::kBlockM);
  if (err == cudaSuccess) err = make_tensor_map(&maps.k, p.k, sh, sh.seqlen_k, sh.heads_kv, p.k_strides, kKVBoxRows);
  if (err == cudaSuccess) err = make_tensor_map(&maps.v, p.v, sh, sh.seqlen_k, sh.heads_kv, p.v_strides, kKVBoxRows);
  if (err != cudaSuccess) return err;
  // The staged output needs a tensor map of out (16-byte aligned rows); without one the threads store.
  // FLASHATTN_SM90_DIRECT_OUTPUT=1 has them store anyway: compute-sanitizer's initcheck does not count
  // TMA stores as writes, so scripts/sanitize.py runs it that way (read on every call, as the tests
  // switch it).
  const bool staged_output =
      Cfg::kStagedOutput && !env_switch("FLASHATTN_SM90_DIRECT_OUTPUT", false) &&
      make_tensor_map(&maps.out, p.out, sh, sh.seqlen_q, sh.heads_q, p.out_strides, 64) == cudaSuccess;
  const int64_t num_tiles = static_cast<int64_t>((sh.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM) * sh.heads_q * sh.batch;
  if (num_tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
  // Persistent CTAs, at most one per SM (see FwdSchedule); tiles go in pairs unless they all fit in
  // one wave, and pairs end in a dynamic tail when there is a counter for it.
  int device = 0, num_sms = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int num_m = (sh.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  // Pairs only where tiles differ in cost (causal, or a mask): with 192-query tiles an odd number of
  // query blocks leaves one single-tile unit per head, and when the CTA count is a multiple of the
  // units per head the same CTAs get every light unit (-5% at N = 2k, D = 64).
  const int tiles_per_unit = num_tiles > num_sms && (sh.is_causal || kMasked) ? 2 : 1;
  const int64_t num_units = (tiles_per_unit == 2 ? (num_m + 1) / 2 : num_m) * static_cast<int64_t>(sh.heads_q) * sh.batch;
  int grid = static_cast<int>(num_units < num_sms ? num_units : num_sms);
  constexpr auto kernel = fwd_kernel<T, Cfg, kMasked, kKeyEnds, kMulticast>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  if constexpr (kMulticast) {  // whole clusters, no more than can be resident at once
    if (tiles_per_unit != 1 || !multicast_fits<Cfg>(sh)) return cudaErrorInvalidConfiguration;
    const int64_t resident = max_resident_clusters<kernel>(Cfg::kThreads, Cfg::kSmemBytes, device);
    // No pair of SMs for a cluster (a partitioned GPU, say): the single-CTA loads.
    if (resident < 1) return launch_fwd_with_config<T, Cfg, kMasked, kKeyEnds, false>(p, stream);
    grid = 2 * static_cast<int>(std::min<int64_t>(num_units / 2, resident));
  }
  // FLASHATTN_SM90_STATIC_SCHEDULE=1 keeps every tile in the static pairs (read on every call: the
  // tests compare the two schedules, and timing them needs no second build).
  const bool dynamic_tail = kFwdDynamicTail<kMasked> && tiles_per_unit == 2 && p.tile_counter != nullptr &&
                            !env_switch("FLASHATTN_SM90_STATIC_SCHEDULE", false);
  const int dynamic_heads = dynamic_tail ? fwd_dynamic_heads(sh, num_m, grid) : 0;
  if (dynamic_heads > 0) {
    err = cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream);
    if (err != cudaSuccess) return err;
  }
  const FwdSchedule sched(sh, Cfg::kBlockM, tiles_per_unit, dynamic_heads);
  if constexpr (kMulticast) {
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config = pair_cluster_config(grid, Cfg::kThreads, Cfg::kSmemBytes, stream, &cluster);
    return cudaLaunchKernelEx(&config, kernel, maps, p, sched, staged_output);
  } else {
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(maps, p, sched, staged_output);
    return cudaGetLastError();
  }
}

// Whether to run a launch that fits (multicast_fits) with K/V multicast. FLASHATTN_SM90_MULTICAST=0 or
// 1 turns it off or on wherever it fits (read on every call: the tests compare both, and timing them
// needs no second build). Unset, tile width 128 uses it from 1024 keys on: +1.5-3.8% from 2k, level at
// 1k, and -1.5% at 512, where a tile's four key blocks leave little L2 traffic to save while the two
// CTAs of a cluster still wait for each other (benchmarks/NOTES.md). Only width 128 has multicast kernels.
inline bool wants_multicast(const AttentionShape& sh) {
  return env_switch("FLASHATTN_SM90_MULTICAST", sh.seqlen_k >= 1024);
}

// Whether an unmasked launch without key ends at tile width 128 runs WideKeyFwdConfig: without causal
// masking from 2048 keys on (with the narrow tail, 532ec64: +3.8% / +2.1% at 2k / 4k against 128-key
// blocks; it was from 8192 before the tail). FLASHATTN_SM90_WIDE_KEY_BLOCKS=0 or 1 turns it off, or on
// for every such launch (read on every call, as the tests compare both).
inline bool wants_wide_key_blocks(const AttentionShape& sh) {
  return env_switch("FLASHATTN_SM90_WIDE_KEY_BLOCKS", !sh.is_causal && sh.seqlen_k >= 2048);
}

// Whether a launch in WideKeyFwdConfig whose rows end in a short key block runs WideKeyTailFwdConfig:
// yes unless FLASHATTN_SM90_NARROW_TAIL=0 (read on every call, as the tests compare both).
inline bool wants_narrow_tail() {
  return env_switch("FLASHATTN_SM90_NARROW_TAIL", true);
}

// The width with multicast kernels: at width 64 multicast measured 0 to -3% (benchmarks/NOTES.md).
template <int kHeadDim>
constexpr bool kFwdMulticastBuilt = kHeadDim == 128;

// An unmasked launch without key ends in configuration Cfg: with K/V multicast where it fits and is
// wanted, else with single-CTA loads.
template <typename T, typename Cfg, int kHeadDim>
cudaError_t launch_fwd_every_key(const FwdParams& p, cudaStream_t stream) {
  if constexpr (kFwdMulticastBuilt<kHeadDim>) {
    if (multicast_fits<Cfg>(p.shape) && wants_multicast(p.shape)) {
      return launch_fwd_with_config<T, Cfg, false, false, true>(p, stream);
    }
  }
  return launch_fwd_with_config<T, Cfg>(p, stream);
}

// A launch in WideKeyFwdConfig: with a narrow tail of 64 or 128 keys where the rows' last block holds no
// more (rows without causal masking, past one full block), else with every block 176 keys wide.
template <typename T, int kHeadDim>
cudaError_t launch_fwd_wide_keys(const FwdParams& p, cudaStream_t stream) {
  using Tail64 = typename WideKeyTailFwdConfig<kHeadDim, 64>::type;
  using Tail128 = typename WideKeyTailFwdConfig<kHeadDim, 128>::type;
  if (wants_narrow_tail()) {
    if (narrow_tail_fits<Tail64>(p.shape)) return launch_fwd_every_key<T, Tail64, kHeadDim>(p, stream);
    if (narrow_tail_fits<Tail128>(p.shape)) return launch_fwd_every_key<T, Tail128, kHeadDim>(p, stream);
  }
  return launch_fwd_every_key<T, typename WideKeyFwdConfig<kHeadDim>::type, kHeadDim>(p, stream);
}

template <typename T, int kHeadDim>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using Default = typename DefaultFwdConfig<kHeadDim>::type;
  using LongRows = typename LongRowFwdConfig<kHeadDim>::type;
  const bool key_ends = p.key_end != nullptr;
  if constexpr (!std::is_same_v<LongRows, Default>) {
    if (uses_long_row_config(p.shape)) {
      return key_ends ? launch_fwd_with_config<T, LongRows, false, true>(p, stream)
                      : launch_fwd_every_key<T, LongRows, kHeadDim>(p, stream);
    }
  }
  if constexpr (kHeadDim == 128) {
    if (!key_ends && wants_wide_key_blocks(p.shape)) return launch_fwd_wide_keys<T, kHeadDim>(p, stream);
  }
  if (key_ends) return launch_fwd_with_config<T, Default, false, true>(p, stream);
  if constexpr (kHeadDim == 64) {  // two consumer warpgroups: prefetched scores
    return launch_fwd_every_key<T, typename PrefetchScoresFwdConfig<kHeadDim>::type, kHeadDim>(p, stream);
  } else {
    return launch_fwd_every_key<T, Default, kHeadDim>(p, stream);
  }
}

template <typename T, int kHeadDim>
cudaError_t launch_fwd_masked(const FwdParams& p, cudaStream_t stream) {
  return launch_fwd_with_config<T, typename MaskedFwdConfig<kHeadDim>::type, true>(p, stream);
}


}  // namespace sm90
}  // namespace flashattn
