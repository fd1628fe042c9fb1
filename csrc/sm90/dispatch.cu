// The sm90 path's host entry points (api.h): what it serves, and the launch of a planned kernel for
// (element type, tile width).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "sm90/api.h"
#include "sm90/bwd_config.h"
#include "sm90/fwd_config.h"
#include "sm90/head_dims.h"
#include "sm90/launch.h"

namespace flashattn {
namespace sm90 {
namespace {

// A kernel as large as the forward's multicast kernels (threads, shared memory), to ask how many clusters
// of two of them can be resident. Never launched.
constexpr int kMulticastThreads = DefaultFwdConfig<128>::type::kThreads;
constexpr int kMulticastSmemBytes =
    std::max({DefaultFwdConfig<128>::type::kSmemBytes, WideKeyFwdConfig<128>::type::kSmemBytes,
              WideKeyTailFwdConfig<128, 64>::type::kSmemBytes, WideKeyTailFwdConfig<128, 128>::type::kSmemBytes});
static_assert(WideKeyFwdConfig<128>::type::kThreads == kMulticastThreads &&
                  WideKeyTailFwdConfig<128, 64>::type::kThreads == kMulticastThreads,
              "the multicast kernels have one block size");

__global__ void __launch_bounds__(kMulticastThreads, 1) pair_cluster_probe_kernel() {}

bool finite_positive(float x) { return x > 0.f && std::isfinite(x); }

// run_fwd's launch, in the kernels' form with ALiBi's term (kAlibi) or without.
template <bool kAlibi>
cudaError_t run_fwd_form(const FwdParams& launch, const FwdLaunchPlan& plan, cudaStream_t stream) {
  const bool bf16 = launch.shape.element_type == ElementType::kBFloat16;
  const bool masked = plan.rows == FwdRows::kMasked;
#define FLASHATTN_LAUNCH(D)                                                           \
  if (plan.width == D) {                                                              \
    if (masked) {                                                                     \
      return bf16 ? launch_fwd_masked<__nv_bfloat16, D, kAlibi>(launch, plan, stream) \
                  : launch_fwd_masked<__half, D, kAlibi>(launch, plan, stream);       \
    }                                                                                 \
    return bf16 ? launch_fwd<__nv_bfloat16, D, kAlibi>(launch, plan, stream)          \
                : launch_fwd<__half, D, kAlibi>(launch, plan, stream);                \
  }
  FLASHATTN_SM90_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
  return cudaErrorInvalidValue;
}

// run_fwd_varlen's launch, in the kernel's form with ALiBi's term (kAlibi) or without.
template <bool kAlibi>
cudaError_t run_fwd_varlen_form(const FwdParams& p, int grid, cudaStream_t stream) {
  const int width = fwd_tile_width(p.shape.head_dim);
  const bool bf16 = p.shape.element_type == ElementType::kBFloat16;
#define FLASHATTN_LAUNCH(D)                                                    \
  if (width == D) {                                                            \
    return bf16 ? launch_fwd_varlen<__nv_bfloat16, D, kAlibi>(p, grid, stream) \
                : launch_fwd_varlen<__half, D, kAlibi>(p, grid, stream);       \
  }
  FLASHATTN_SM90_VARLEN_FWD_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
  return cudaErrorInvalidValue;
}

}  // namespace

bool compiled() {
#if defined(FLASHATTN_SM90)
  return true;
#else
  return false;
#endif
}

bool tma_describable(const void* ptr, const TensorStrides& st) {
  constexpr int64_t kElementBytes = 2;
  auto ok = [](int64_t stride) { return stride > 0 && stride * kElementBytes % 16 == 0 && stride * kElementBytes < (int64_t{1} << 40); };
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && ok(st.batch) && ok(st.row) && ok(st.head);
}

bool fwd_supported(const AttentionShape& s, bool qkv_tma) {
  return compiled() && fwd_tile_width(s.head_dim) > 0 && finite_positive(s.scale) && qkv_tma;
}

int max_pair_clusters(int device) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cache[kCachedDevices] = {};  // count + 1; 0: not asked yet
  if (device >= 0 && device < kCachedDevices && cache[device].load(std::memory_order_relaxed) > 0) {
    return cache[device] - 1;
  }
  int clusters = 0;
  int current = 0;
  if (compiled() && cudaGetDevice(&current) == cudaSuccess && current == device &&
      cudaFuncSetAttribute(pair_cluster_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           kMulticastSmemBytes) == cudaSuccess) {
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 2;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(2);
    config.blockDim = dim3(kMulticastThreads);
    config.dynamicSmemBytes = kMulticastSmemBytes;
    config.attrs = &cluster;
    config.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&clusters, pair_cluster_probe_kernel, &config) != cudaSuccess) clusters = 0;
  }
  (void)cudaGetLastError();  // a failed query leaves no error behind for the next launch to report
  if (device >= 0 && device < kCachedDevices) cache[device] = clusters + 1;
  return clusters;
}

cudaError_t run_fwd(const FwdParams& p, const FwdLaunchPlan& plan, cudaStream_t stream) {
  FwdParams launch = p;
  launch.shape = plan.shape;
  if (plan.rows != FwdRows::kMasked) launch.mask = MaskParams{};  // the unmasked kernels read none
  return launch.shape.alibi_slopes != nullptr ? run_fwd_form<true>(launch, plan, stream)
                                              : run_fwd_form<false>(launch, plan, stream);
}

int bwd_tile_width(int head_dim) {
  if (head_dim <= 32) return 0;
#define FLASHATTN_PICK_SMALLEST(D) \
  if (head_dim <= D) return D;
  FLASHATTN_SM90_BWD_FOR_EACH_HEAD_DIM(FLASHATTN_PICK_SMALLEST)
#undef FLASHATTN_PICK_SMALLEST
  return 0;
}

bool bwd_supported(const AttentionShape& s, bool tensors_tma) {
  return compiled() && bwd_tile_width(s.head_dim) > 0 && finite_positive(s.scale) && tensors_tma;
}

bool bwd_masked_supported(int head_dim) {
  const int width = bwd_tile_width(head_dim);
#define FLASHATTN_MATCH(D) \
  if (width == D) return true;
  FLASHATTN_SM90_BWD_MASKED_FOR_EACH_HEAD_DIM(FLASHATTN_MATCH)
#undef FLASHATTN_MATCH
  return false;
}

TileShape bwd_tile_shape() { return TileShape{BwdConfig<64>::kBlockM, BwdConfig<64>::kBlockN}; }
static_assert(BwdConfig<64>::kBlockM == BwdConfig<128>::kBlockM && BwdConfig<64>::kBlockN == BwdConfig<128>::kBlockN,
              "one backward grid at every tile width");

cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  const int width = bwd_tile_width(p.shape.head_dim);
  const bool bf16 = p.shape.element_type == ElementType::kBFloat16;
  if (p.mask.kind != MaskKind::kNone || p.dropout.enabled) {  // the variant with both
#define FLASHATTN_LAUNCH(D) \
  if (width == D) return bf16 ? launch_bwd_masked<__nv_bfloat16, D>(p, stream) : launch_bwd_masked<__half, D>(p, stream);
    FLASHATTN_SM90_BWD_MASKED_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
    return cudaErrorInvalidValue;
  }
#define FLASHATTN_LAUNCH(D) \
  if (width == D) return bf16 ? launch_bwd<__nv_bfloat16, D>(p, stream) : launch_bwd<__half, D>(p, stream);
  FLASHATTN_SM90_BWD_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
  return cudaErrorInvalidValue;
}

bool varlen_supported(const AttentionShape& s, bool tensors_tma) {
  return compiled() && s.head_dim > 32 && s.head_dim <= 256 && finite_positive(s.scale) && tensors_tma;
}

cudaError_t run_fwd_varlen(const FwdParams& p, int grid, cudaStream_t stream) {
  return p.shape.alibi_slopes != nullptr ? run_fwd_varlen_form<true>(p, grid, stream)
                                         : run_fwd_varlen_form<false>(p, grid, stream);
}

cudaError_t run_bwd_varlen(const BwdParams& p, cudaStream_t stream) {
  const int width = bwd_tile_width(p.shape.head_dim);
  const bool bf16 = p.shape.element_type == ElementType::kBFloat16;
#define FLASHATTN_LAUNCH(D) \
  if (width == D) return bf16 ? launch_bwd_varlen<__nv_bfloat16, D>(p, stream) : launch_bwd_varlen<__half, D>(p, stream);
  FLASHATTN_SM90_VARLEN_BWD_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
  return cudaErrorInvalidValue;
}

}  // namespace sm90
}  // namespace flashattn
