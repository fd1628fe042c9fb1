// Launches of the decode kernel and its split combine (decode_kernel.cuh), one instantiation per
// (element type, head-dim width), and the split heuristic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <atomic>

#include "decode/api.h"
#include "decode/decode_config.h"
#include "decode/decode_kernel.cuh"
#include "plan.h"

namespace flashattn {
namespace decode {
namespace {

constexpr int kThreads = kWarps * 32;
constexpr int kMaxDevices = 64;
constexpr int kWidthCount = sizeof(kWidths) / sizeof(kWidths[0]);

using DecodeKernel = void (*)(DecodeParams);

// Ring stages per warp at `width`: the planner's decode_stages option where the width has that form,
// else stages_for's.
int stages_at(int width) {
  const int option = plan_options().decode_stages;
  return option != 0 && has_stages(width, option) ? option : stages_for(width);
}

template <typename T, int kWidth>
DecodeKernel kernel_of_depth(int stages) {
  if constexpr (has_stages(kWidth, 2)) {
    if (stages == 2) return decode_kernel<T, kWidth, 2>;
  }
  if constexpr (has_stages(kWidth, 3)) {
    if (stages == 3) return decode_kernel<T, kWidth, 3>;
  }
  return decode_kernel<T, kWidth, stages_for(kWidth)>;
}

template <typename T>
DecodeKernel kernel_of_width(int width, int stages) {
  switch (width) {
    case 64: return kernel_of_depth<T, 64>(stages);
    case 96: return kernel_of_depth<T, 96>(stages);
    case 128: return kernel_of_depth<T, 128>(stages);
    case 192: return kernel_of_depth<T, 192>(stages);
    case 256: return kernel_of_depth<T, 256>(stages);
    default: return nullptr;
  }
}

int smem_for(int head_dim, ElementType type, int stages) {
  const int width = width_for(head_dim);
  if (width == 0) return 0;
  return type == ElementType::kBFloat16 ? smem_bytes<__nv_bfloat16>(width, stages) : smem_bytes<__half>(width, stages);
}

// One instantiation on one device: its dynamic shared memory opted into once, and how many of its
// thread blocks an SM holds (asked once).
struct Instance {
  DecodeKernel kernel = nullptr;
  int smem = 0;
  int blocks_per_sm = 1;
};

// The instantiation serving (head_dim, type) on the current device, ready to launch.
cudaError_t instance_for(int head_dim, ElementType type, Instance& out) {
  // Blocks per SM (0: not asked yet) per device, element type, width and ring depth (2, 3 or 4).
  static std::array<std::atomic<int>, kMaxDevices * 2 * kWidthCount * 3> asked{};
  const int width = width_for(head_dim);
  if (width == 0) return cudaErrorInvalidValue;
  const int stages = stages_at(width);
  out.kernel = type == ElementType::kBFloat16 ? kernel_of_width<__nv_bfloat16>(width, stages)
                                              : kernel_of_width<__half>(width, stages);
  out.smem = smem_for(head_dim, type, stages);
  if (out.kernel == nullptr) return cudaErrorInvalidValue;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  int w = 0;
  while (kWidths[w] != width) ++w;
  const int slot = ((device * 2 + (type == ElementType::kBFloat16)) * kWidthCount + w) * 3 + (stages - 2);
  if (device < kMaxDevices) {
    out.blocks_per_sm = asked[slot].load(std::memory_order_acquire);
    if (out.blocks_per_sm > 0) return cudaSuccess;
  }
  // The attribute is per device and function.
  err = cudaFuncSetAttribute(out.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, out.smem);
  if (err != cudaSuccess) return err;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, out.kernel, kThreads, out.smem) != cudaSuccess) {
    (void)cudaGetLastError();  // a failed query leaves no sticky error: count one block an SM
  }
  out.blocks_per_sm = blocks < 1 ? 1 : blocks;
  if (device < kMaxDevices) asked[slot].store(out.blocks_per_sm, std::memory_order_release);
  return cudaSuccess;
}

template <typename T>
cudaError_t launch_combine(const DecodeParams& p, int64_t rows, cudaStream_t stream) {
  // On sm90 the combine kernel is a programmatic dependent launch: its launch latency, a large share of
  // a short decoding step, overlaps the decode kernel's tail instead of following it.
  int device = 0, major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((rows + 3) / 4));
  config.blockDim = dim3(128);
  config.stream = stream;
  config.attrs = overlap;
  config.numAttrs = major >= 9 ? 1 : 0;
  return cudaLaunchKernelEx(&config, decode_combine_kernel<T>, p);
}

}  // namespace

bool supported(int head_dim, ElementType type, int smem_per_block) {
  if (head_dim < 8 || head_dim % 8 != 0 || width_for(head_dim) == 0) return false;
  return smem_per_block == 0 || smem_for(head_dim, type, stages_for(width_for(head_dim))) <= smem_per_block;
}

int rows_per_block() { return kRows; }

int choose_splits(int batch, int heads_kv, int row_groups, int max_keys, int head_dim, ElementType type,
                  int num_sms) {
  // A split shorter than this many keys spends more on its partial output and the merge than it gains.
  constexpr int kMinKeysPerSplit = 4 * kWarps * kBlockKeys;
  constexpr int kMaxSplits = 128;
  const int64_t blocks = static_cast<int64_t>(batch) * heads_kv * row_groups;
  Instance instance;
  if (blocks <= 0 || instance_for(head_dim, type, instance) != cudaSuccess) return 1;
  int64_t splits = static_cast<int64_t>(num_sms) * instance.blocks_per_sm / blocks;
  splits = std::min<int64_t>(splits, (max_keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
  return static_cast<int>(std::clamp<int64_t>(splits, 1, kMaxSplits));
}

cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  if (p.num_splits < 1 || !supported(p.head_dim, p.element_type, 0)) return cudaErrorInvalidValue;
  const int rows = p.heads_q / p.heads_kv * p.seqlen_q;
  const int64_t grid = static_cast<int64_t>(p.batch) * p.heads_kv * p.num_splits * ((rows + kRows - 1) / kRows);
  if (grid == 0) return cudaSuccess;
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  Instance instance;
  cudaError_t err = instance_for(p.head_dim, p.element_type, instance);
  if (err != cudaSuccess) return err;
  instance.kernel<<<static_cast<int>(grid), kThreads, instance.smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits == 1) return err;
  const int64_t combine_rows = static_cast<int64_t>(p.batch) * p.heads_kv * rows;
  return p.element_type == ElementType::kBFloat16 ? launch_combine<__nv_bfloat16>(p, combine_rows, stream)
                                                  : launch_combine<__half>(p, combine_rows, stream);
}

}  // namespace decode
}  // namespace flashattn
