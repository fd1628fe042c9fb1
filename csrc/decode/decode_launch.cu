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

namespace flashattn {
namespace decode {
namespace {

constexpr int kThreads = kWarps * 32;
constexpr int kMaxDevices = 64;

template <typename T, int kWidth>
cudaError_t launch_width(const DecodeParams& p, int grid, cudaStream_t stream) {
  constexpr int kSmem = smem_bytes<T>(kWidth);
  // The attribute is per device: set once for each.
  static std::array<std::atomic<bool>, kMaxDevices> opted_in{};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !opted_in[device].load(std::memory_order_acquire)) {
    err = cudaFuncSetAttribute(decode_kernel<T, kWidth>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) opted_in[device].store(true, std::memory_order_release);
  }
  decode_kernel<T, kWidth><<<grid, kThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const DecodeParams& p, cudaStream_t stream) {
  const int rows = p.heads_q / p.heads_kv * p.seqlen_q;
  const int64_t grid = static_cast<int64_t>(p.batch) * p.heads_kv * p.num_splits * ((rows + kRows - 1) / kRows);
  if (grid == 0) return cudaSuccess;
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  switch (width_for(p.head_dim)) {
    case 64: err = launch_width<T, 64>(p, static_cast<int>(grid), stream); break;
    case 96: err = launch_width<T, 96>(p, static_cast<int>(grid), stream); break;
    case 128: err = launch_width<T, 128>(p, static_cast<int>(grid), stream); break;
    case 192: err = launch_width<T, 192>(p, static_cast<int>(grid), stream); break;
    case 256: err = launch_width<T, 256>(p, static_cast<int>(grid), stream); break;
    default: return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess || p.num_splits == 1) return err;
  const int64_t combine_rows = static_cast<int64_t>(p.batch) * p.heads_kv * rows;
  // On sm90 the combine kernel is a programmatic dependent launch: its launch latency, a large share of
  // a short decoding step, overlaps the decode kernel's tail instead of following it.
  int device = 0, major = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((combine_rows + 3) / 4));
  config.blockDim = dim3(128);
  config.stream = stream;
  config.attrs = overlap;
  config.numAttrs = major >= 9 ? 1 : 0;
  return cudaLaunchKernelEx(&config, decode_combine_kernel<T>, p);
}

int smem_for(int head_dim, ElementType type) {
  const int width = width_for(head_dim);
  if (width == 0) return 0;
  return type == ElementType::kBFloat16 ? smem_bytes<__nv_bfloat16>(width) : smem_bytes<__half>(width);
}

// Thread blocks of the call's instantiation one SM holds at once, asked once per (device, type, width).
int blocks_per_sm(int head_dim, ElementType type, int device) {
  static std::array<std::atomic<int>, kMaxDevices * 2 * 5> cache{};
  const int width = width_for(head_dim);
  int w = 0;
  while (kWidths[w] != width) ++w;
  const int slot = (device * 2 + (type == ElementType::kBFloat16)) * 5 + w;
  if (device < kMaxDevices) {
    const int cached = cache[slot].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int blocks = 0;
  const int smem = smem_for(head_dim, type);
  cudaError_t err = cudaSuccess;
  auto ask = [&](auto kernel) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, smem);
  };
  const bool bf16 = type == ElementType::kBFloat16;
  switch (width) {
    case 64: bf16 ? ask(decode_kernel<__nv_bfloat16, 64>) : ask(decode_kernel<__half, 64>); break;
    case 96: bf16 ? ask(decode_kernel<__nv_bfloat16, 96>) : ask(decode_kernel<__half, 96>); break;
    case 128: bf16 ? ask(decode_kernel<__nv_bfloat16, 128>) : ask(decode_kernel<__half, 128>); break;
    case 192: bf16 ? ask(decode_kernel<__nv_bfloat16, 192>) : ask(decode_kernel<__half, 192>); break;
    default: bf16 ? ask(decode_kernel<__nv_bfloat16, 256>) : ask(decode_kernel<__half, 256>); break;
  }
  if (err != cudaSuccess || blocks < 1) {
    (void)cudaGetLastError();  // a failed query leaves no sticky error; fall back to one block an SM
    blocks = 1;
  }
  if (device < kMaxDevices) cache[slot].store(blocks, std::memory_order_relaxed);
  return blocks;
}

}  // namespace

bool supported(int head_dim, ElementType type, int smem_per_block) {
  if (head_dim < 8 || head_dim % 8 != 0 || width_for(head_dim) == 0) return false;
  return smem_per_block == 0 || smem_for(head_dim, type) <= smem_per_block;
}

int rows_per_block() { return kRows; }

int choose_splits(int batch, int heads_kv, int row_groups, int max_keys, int head_dim, ElementType type,
                  int num_sms, int device) {
  // A split shorter than this many keys spends more on its partial output and the merge than it gains.
  constexpr int kMinKeysPerSplit = 4 * kWarps * kBlockKeys;
  constexpr int kMaxSplits = 128;
  const int64_t blocks = static_cast<int64_t>(batch) * heads_kv * row_groups;
  if (blocks <= 0) return 1;
  const int64_t slots = static_cast<int64_t>(num_sms) * blocks_per_sm(head_dim, type, device);
  int64_t splits = slots / blocks;
  splits = std::min<int64_t>(splits, (max_keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
  return static_cast<int>(std::clamp<int64_t>(splits, 1, kMaxSplits));
}

cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  if (p.num_splits < 1 || !supported(p.head_dim, p.element_type, 0)) return cudaErrorInvalidValue;
  return p.element_type == ElementType::kBFloat16 ? launch_typed<__nv_bfloat16>(p, stream)
                                                  : launch_typed<__half>(p, stream);
}

}  // namespace decode
}  // namespace flashattn
