// DRAFT, not yet run on a GPU: a Hopper forward for head dim 128 (bf16/fp16), built only by the tuning
// harness so it can be checked against the package's forward and timed before it is wired into
// dispatch (csrc/sm90/).
//
// Design: one CTA per (128-query block, head, batch), three warpgroups. Warpgroup 0 is the producer:
// one thread issues TMA bulk tensor loads of Q (once) and of K/V blocks into a two-stage ring, each
// stage completed on an mbarrier ("full") and released by the consumers on another ("empty").
// Warpgroups 1 and 2 each own 64 query rows: S = Q K^T with wgmma from shared memory (m64n128k16),
// the online softmax in registers (the accumulator layout matches mma.sync's per warp), then
// O += P V with P from registers and V from shared memory (transposed B operand).
// Shared tiles use the 128-byte swizzle, written by TMA and read by wgmma through matrix descriptors;
// a 128-column tile is two [rows][64] column blocks.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/mask.h"
#include "params.h"
#include "sm80/ptx.h"

namespace flashattn {
namespace sm90_draft {

constexpr int kHeadDim = 128;
constexpr int kBlockM = 128;            // query rows per CTA: 64 per consumer warpgroup
constexpr int kBlockN = 128;            // keys per step
constexpr int kStages = 2;
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kColBlock = 64;           // elements per 128-byte swizzle row
constexpr int kTileBlockBytes = 128 * kColBlock * 2;  // one [128 rows][64] column block: 16 KiB
constexpr int kTileBytes = 2 * kTileBlockBytes;       // a [128][128] tile
// Q, then per stage K and V; then the mbarriers. +1024 to align the base for the swizzle.
constexpr int kSmemBytes = kTileBytes * (1 + 2 * kStages) + 1024 + 256;

// ---- PTX wrappers (sm_90a) ----

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)));
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity));
}

// 4-D tensor map coordinates (innermost first): column, row, head, batch.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int row, int head,
                                         int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(smem_u32(bar))
      : "memory");
}

// Matrix descriptor of a 128-byte-swizzled shared tile: start address, leading and stride byte offsets.
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t leading_bytes, uint32_t stride_bytes) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_u32(p) & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(1) << 62;  // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// 64 fp32 accumulators of m64n128: acc[4 * j + e] is n8 block j, element e in mma.sync's C layout.
#define FA_ACC64(X)                                                                                         \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18)   \
      X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31) X(32) X(33) X(34) X(35) \
          X(36) X(37) X(38) X(39) X(40) X(41) X(42) X(43) X(44) X(45) X(46) X(47) X(48) X(49) X(50) X(51)   \
              X(52) X(53) X(54) X(55) X(56) X(57) X(58) X(59) X(60) X(61) X(62) X(63)
#define FA_OPERAND(i) "+f"(acc[i]),
#define FA_REGS                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "  \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "    \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "    \
  "%62, %63}"

// acc (m64n128) += A (shared, K-major) * B (shared, K-major), one k16 step; scale_d = 0 overwrites acc.
template <typename T>
__device__ __forceinline__ void wgmma_ss(float (&acc)[64], uint64_t desc_a, uint64_t desc_b, int scale_d);

template <>
__device__ __forceinline__ void wgmma_ss<__nv_bfloat16>(float (&acc)[64], uint64_t desc_a, uint64_t desc_b,
                                                       int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FA_REGS ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : FA_ACC64(FA_OPERAND) "+l"(desc_a)
      : "l"(desc_b), "r"(scale_d));
}

// acc (m64n128) += A (registers, mma.sync A layout per warp) * B (shared, MN-major: transposed).
template <typename T>
__device__ __forceinline__ void wgmma_rs(float (&acc)[64], const uint32_t (&a)[4], uint64_t desc_b);

template <>
__device__ __forceinline__ void wgmma_rs<__nv_bfloat16>(float (&acc)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  // Operand order: scale-d (predicate, 1 = accumulate), imm-scale-a, imm-scale-b, imm-trans-b.
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FA_REGS
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : FA_ACC64(FA_OPERAND) "+r"(const_cast<uint32_t&>(a[0])), "+r"(const_cast<uint32_t&>(a[1])),
        "+r"(const_cast<uint32_t&>(a[2])), "+r"(const_cast<uint32_t&>(a[3]))
      : "l"(desc_b));
}

struct Maps {
  CUtensorMap q, k, v;
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) fwd_kernel(const __grid_constant__ Maps maps, const FwdParams p) {
  using Ops = sm80::ElementOps<T>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* q_smem = base;                                  // 2 x [128][64] swizzled
  unsigned char* k_smem = base + kTileBytes;                     // [kStages] x 2 x [128][64]
  unsigned char* v_smem = k_smem + kStages * kTileBytes;         // [kStages] x 2 x [128][64]
  uint64_t* bars = reinterpret_cast<uint64_t*>(v_smem + kStages * kTileBytes);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;            // [kStages]
  uint64_t* v_full = k_full + kStages;    // [kStages]
  uint64_t* empty = v_full + kStages;     // [kStages]

  const AttentionShape& s = p.shape;
  const int num_m_blocks = (s.seqlen_q + kBlockM - 1) / kBlockM;
  const int m_block = num_m_blocks - 1 - static_cast<int>(blockIdx.x % num_m_blocks);
  const int head = static_cast<int>((blockIdx.x / num_m_blocks) % s.heads_q);
  const int batch = static_cast<int>(blockIdx.x / num_m_blocks / s.heads_q);
  const int kv_head = head / (s.heads_q / s.heads_kv);
  const int m0 = m_block * kBlockM;
  const int key_end = visible_key_end(min(m0 + kBlockM, s.seqlen_q), s.seqlen_k, s.is_causal, s.causal_offset);
  const int num_n_blocks = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
  const int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    mbar_init(q_full, 1);
    for (int i = 0; i < kStages; ++i) {
      mbar_init(&k_full[i], 1);
      mbar_init(&v_full[i], 1);
      mbar_init(&empty[i], kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warpgroup == 0) {
    // Producer: Q once, then K and V blocks as stages free up.
    if (threadIdx.x == 0) {
      mbar_expect_tx(q_full, kTileBytes);
      tma_load(q_smem, &maps.q, q_full, 0, m0, head, batch);
      tma_load(q_smem + kTileBlockBytes, &maps.q, q_full, kColBlock, m0, head, batch);
      for (int n = 0; n < num_n_blocks; ++n) {
        const int stage = n % kStages;
        const int use = n / kStages;
        if (use > 0) mbar_wait(&empty[stage], (use - 1) & 1);
        unsigned char* k_tile = k_smem + stage * kTileBytes;
        unsigned char* v_tile = v_smem + stage * kTileBytes;
        mbar_expect_tx(&k_full[stage], kTileBytes);
        tma_load(k_tile, &maps.k, &k_full[stage], 0, n * kBlockN, kv_head, batch);
        tma_load(k_tile + kTileBlockBytes, &maps.k, &k_full[stage], kColBlock, n * kBlockN, kv_head, batch);
        mbar_expect_tx(&v_full[stage], kTileBytes);
        tma_load(v_tile, &maps.v, &v_full[stage], 0, n * kBlockN, kv_head, batch);
        tma_load(v_tile + kTileBlockBytes, &maps.v, &v_full[stage], kColBlock, n * kBlockN, kv_head, batch);
      }
    }
    return;
  }

  // Consumers: warpgroup c owns rows [64 c, 64 c + 64) of the block; each warp 16 of them.
  const int consumer = warpgroup - 1;
  const int warp_in_group = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const int row_base = consumer * 64 + warp_in_group * 16 + lane / 4;  // this lane's rows: +0 and +8
  float o_acc[64];
  float s_acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  mbar_wait(q_full, 0);
  for (int n = 0; n < num_n_blocks; ++n) {
    const int stage = n % kStages;
    const int parity = (n / kStages) & 1;
    const unsigned char* k_tile = k_smem + stage * kTileBytes;
    const unsigned char* v_tile = v_smem + stage * kTileBytes;
    const int n0 = n * kBlockN;

    // S = Q K^T: 8 k16 steps; within a 64-column block a step advances the start by 32 bytes.
    mbar_wait(&k_full[stage], parity);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const int blk = ks / 4, within = (ks % 4) * 32;
      const uint64_t desc_q = smem_desc(q_smem + blk * kTileBlockBytes + consumer * 64 * 128 + within, 16, 1024);
      const uint64_t desc_k = smem_desc(k_tile + blk * kTileBlockBytes + within, 16, 1024);
      wgmma_ss<T>(s_acc, desc_q, desc_k, ks > 0);
    }
    wgmma_commit();
    wgmma_wait_all();

    // Scale to base 2, mask, online softmax (as in the sm80 forward).
#pragma unroll
    for (int i = 0; i < 64; ++i) s_acc[i] *= s.scale_log2;
    if (n0 + kBlockN > s.seqlen_k || (s.is_causal && n0 + kBlockN - 1 > m0 + consumer * 64 + s.causal_offset)) {
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int key = n0 + (i / 4) * 8 + (lane % 4) * 2 + (i % 2);
        const int query = m0 + row_base + ((i % 4) / 2) * 8;
        s_acc[i] = key_visible(query, key, s.seqlen_k, s.is_causal, s.causal_offset) ? s_acc[i] : -INFINITY;
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float block_max = row_max[half];
#pragma unroll
      for (int j = 0; j < 16; ++j) block_max = fmaxf(block_max, fmaxf(s_acc[4 * j + 2 * half], s_acc[4 * j + 2 * half + 1]));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffff, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffff, block_max, 2));
      const float base_max = block_max == -INFINITY ? 0.f : block_max;
      const float correction = exp2f(row_max[half] - base_max);
      row_max[half] = block_max;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        s_acc[4 * j + 2 * half] = exp2f(s_acc[4 * j + 2 * half] - base_max);
        s_acc[4 * j + 2 * half + 1] = exp2f(s_acc[4 * j + 2 * half + 1] - base_max);
        sum += s_acc[4 * j + 2 * half] + s_acc[4 * j + 2 * half + 1];
        o_acc[4 * j + 2 * half] *= correction;
        o_acc[4 * j + 2 * half + 1] *= correction;
      }
      row_sum[half] = row_sum[half] * correction + sum;
    }

    // O += P V: 8 k16 steps over keys; V is [keys][d] so B is MN-major (transposed): the next 64
    // columns sit one column block (16 KiB) further, the next 8 keys 1024 bytes further.
    mbar_wait(&v_full[stage], parity);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      a[0] = Ops::pack(s_acc[8 * kk + 0], s_acc[8 * kk + 1]);
      a[1] = Ops::pack(s_acc[8 * kk + 2], s_acc[8 * kk + 3]);
      a[2] = Ops::pack(s_acc[8 * kk + 4], s_acc[8 * kk + 5]);
      a[3] = Ops::pack(s_acc[8 * kk + 6], s_acc[8 * kk + 7]);
      const uint64_t desc_v = smem_desc(v_tile + kk * 16 * 128, kTileBlockBytes, 1024);
      wgmma_rs<T>(o_acc, a, desc_v);
    }
    wgmma_commit();
    wgmma_wait_all();
    // Both stages' reads by this warpgroup are complete: release the stage (one arrive per group).
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + consumer));
    if (threadIdx.x % 128 == 0) mbar_arrive(&empty[stage]);
  }

  // Epilogue: O / rowsum straight to global, LSE.
  T* out = static_cast<T*>(p.out) + batch * p.out_strides.batch + head * p.out_strides.head;
  float* lse = p.lse + (static_cast<int64_t>(batch) * s.heads_q + head) * s.seqlen_q;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = row_sum[half];
    sum += __shfl_xor_sync(0xffffffff, sum, 1);
    sum += __shfl_xor_sync(0xffffffff, sum, 2);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int row = m0 + row_base + half * 8;
    if (row >= s.seqlen_q) continue;
    if (lane % 4 == 0) lse[row] = sum > 0.f ? (row_max[half] + log2f(sum)) * 0.6931471805599453f : -INFINITY;
    T* out_row = out + row * p.out_strides.row;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = j * 8 + (lane % 4) * 2;
      if (col < s.head_dim) {
        *reinterpret_cast<uint32_t*>(out_row + col) =
            Ops::pack(o_acc[4 * j + 2 * half] * inv, o_acc[4 * j + 2 * half + 1] * inv);
      }
    }
  }
}

// Tensor map of a [B, L, H, D] tensor read in [rows][64] boxes with the 128-byte swizzle.
inline cudaError_t make_map(CUtensorMap* map, const void* ptr, int batch, int seqlen, int heads, int head_dim,
                            const TensorStrides& st, CUtensorMapDataType dtype, int box_rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    cudaDriverEntryPointQueryResult status;
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode),
                                                       12000, cudaEnableDefault, &status);
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess) return cudaErrorNotSupported;
  }
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(st.row) * 2, static_cast<cuuint64_t>(st.head) * 2,
                                 static_cast<cuuint64_t>(st.batch) * 2};
  const cuuint32_t box[4] = {kColBlock, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUresult r = encode(map, dtype, 4, const_cast<void*>(ptr), dims, strides, box, elem_strides,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Needs head_dim == 128 (the draft has no padding), 16-byte aligned rows, bf16.
template <typename T>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  const AttentionShape& s = p.shape;
  if (s.head_dim != kHeadDim || !s.rows_aligned_16) return cudaErrorInvalidValue;
  Maps maps;
  const CUtensorMapDataType dtype = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  cudaError_t err = make_map(&maps.q, p.q, s.batch, s.seqlen_q, s.heads_q, s.head_dim, p.q_strides, dtype, kBlockM);
  if (err == cudaSuccess) err = make_map(&maps.k, p.k, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, p.k_strides, dtype, kBlockN);
  if (err == cudaSuccess) err = make_map(&maps.v, p.v, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, p.v_strides, dtype, kBlockN);
  if (err != cudaSuccess) return err;
  const int64_t grid = static_cast<int64_t>((s.seqlen_q + kBlockM - 1) / kBlockM) * s.heads_q * s.batch;
  auto kernel = fwd_kernel<T>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(grid), kThreads, kSmemBytes, stream>>>(maps, p);
  return cudaGetLastError();
}

}  // namespace sm90_draft
}  // namespace flashattn
