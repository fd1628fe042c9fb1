// Thin wrappers over the Hopper (sm_90a) instructions of the sm90 path: mbarriers, TMA bulk tensor
// loads, wgmma matrix descriptors and synchronisation, and register reallocation.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#ifdef FLASHATTN_WATCHDOG
#include <cstdio>
#endif

namespace flashattn {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// ---- mbarriers: a phase completes when `count` arrivals and all expected transaction bytes are in ----

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}

// Makes the initialised barriers visible to the async (TMA) proxy.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also announces `bytes` of TMA data to come.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Announces `bytes` of TMA data to come without arriving (the arrivals come separately).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// One arrival on the barrier at `bar`'s offset in the shared memory of CTA `cta` of this cluster
// (possibly this one). Release at CTA scope only: its users release ring stages whose reads (wgmma)
// have completed, and a cluster-scope release costs a GPU-wide memory barrier (MEMBAR.ALL.GPU) each.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(cta)
      : "memory");
}
// Blocks until the phase with the given parity has completed.
#ifndef FLASHATTN_WATCHDOG
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
#else
// Debug builds (-DFLASHATTN_WATCHDOG): a wait that lasts more than about two seconds prints where it
// is (block, thread, barrier offset in shared memory, parity) and traps, so a deadlock shows up as a
// launch failure ("an illegal instruction was encountered") instead of a hang. The printed lines can
// be lost with the trap: seen on the H200, where the failure came without them. Such a build is also
// slower (the printf call makes ptxas serialize the wgmma pipeline), so it changes the timing.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  const long long start = clock64();
  for (;;) {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
    if (done) return;
    if (clock64() - start > 4000000000LL) {
      if (threadIdx.x % 32 == 0) {
        printf("watchdog: block %d thread %d barrier smem+%u parity %d\n", blockIdx.x, threadIdx.x,
               smem_u32(bar), parity);
      }
      __trap();
    }
  }
}
#endif

// ---- TMA ----

// Loads the box at coordinates (col, row, head, batch) of a 4-D tensor map into shared memory and
// completes its bytes on `bar`.
__device__ __forceinline__ void tma_load_4d(void* smem, const CUtensorMap* map, uint64_t* bar, int col, int row,
                                            int head, int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(smem_u32(bar))
      : "memory");
}

// tma_load_4d into every CTA of the cluster named in `cta_mask` (bit i: CTA rank i): the box lands at
// the same shared-memory offset in each, and its bytes complete on the barrier at `bar`'s offset in each.
__device__ __forceinline__ void tma_load_4d_multicast(void* smem, const CUtensorMap* map, uint64_t* bar, int col,
                                                      int row, int head, int batch, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(smem_u32(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(smem_u32(bar)),
      "h"(cta_mask)
      : "memory");
}
// Loads rows [row, row + box rows) of a [rows][kColBlocks * 64] tile stored as kColBlocks column blocks
// of [box rows][64] elements, `col_block_bytes` apart, all completing on `bar`.
template <int kColBlocks>
__device__ __forceinline__ void tma_load_tile(unsigned char* smem, const CUtensorMap* map, uint64_t* bar, int row,
                                              int head, int batch, int col_block_bytes) {
#pragma unroll
  for (int cb = 0; cb < kColBlocks; ++cb) tma_load_4d(smem + cb * col_block_bytes, map, bar, cb * 64, row, head, batch);
}

// Stores the box at coordinates (col, row, head, batch) of a 4-D tensor map from shared memory,
// asynchronously (a bulk group: bulk_commit, then bulk_wait_read before the buffer is written again).
// Elements past the tensor's extent are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* smem, int col, int row, int head,
                                             int batch) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(smem)), "r"(col), "r"(row), "r"(head), "r"(batch)
               : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Adds `bytes` (a multiple of 16) of fp32 values from shared memory into global memory, element-wise,
// asynchronously (one bulk operation; both addresses 16-byte aligned).
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(smem_u32(smem)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until the committed bulk operations of this thread have finished reading shared memory.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Waits until they have completed.
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Orders this thread's global-memory accesses through the generic proxy (a counter's acquire or release)
// with its async-proxy ones (bulk reductions).
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// Orders this thread's ordinary shared-memory writes before later async-proxy (wgmma, TMA) accesses.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// 16 bytes to global memory (16-byte aligned) in one store: written as PTX so that the compiler cannot
// split it into narrower stores, which it did for some of the forward's output segments.
__device__ __forceinline__ void st_global_u32x4(void* ptr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// ---- shared memory through 32-bit shared-window addresses (smem_u32): plain ld/st.shared, where a
// pointer that has lost its address space would compile to generic loads and stores ----

__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t value) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(value) : "memory");
}
__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void st_shared_f32x4(uint32_t addr, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_shared_u32x4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// ---- wgmma ----

// Matrix descriptor of a shared tile stored with the 128-byte swizzle (the layout TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B): start address, leading and stride byte offsets (see Wgmma's users for
// what they mean for each operand).
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32;
  desc |= static_cast<uint64_t>(1) << 62;  // layout type 1: 128-byte swizzle
  return desc;
}
__device__ __forceinline__ uint64_t smem_desc_sw128(const void* ptr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return smem_desc_sw128(smem_u32(ptr), leading_bytes, stride_bytes);
}
// `desc` with its start address moved on by `bytes` (a multiple of 16). The start address field is
// the low 14 bits of the low word and shared addresses stay below 2^18 (228 KiB), so the add never
// carries out of the field: one integer add where building the descriptor again takes four.
__device__ __forceinline__ uint64_t smem_desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t low = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | low;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending committed wgmma groups of this warp are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of these registers across a wgmma issue or wait:
// the asynchronous GEMM owns them in between.
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&regs)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(regs[i])::"memory");
}
template <int kCount>
__device__ __forceinline__ void fence_registers(uint32_t (&regs)[kCount][4]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(regs[i][j])::"memory");
  }
}

// ---- warp specialisation ----

// Whether a warp-specialised CTA of one producer warpgroup and `consumer_groups` consumer warpgroups
// can move to these register counts: setmaxnreg only redistributes the CTA's launch allocation (its
// threads times 65536 / threads, rounded down to a multiple of 8), and an increase that allocation
// cannot cover waits forever.
constexpr bool register_split_fits(int producer_registers, int consumer_groups, int consumer_registers) {
  const int threads = 128 * (1 + consumer_groups);
  return 128 * producer_registers + 128 * consumer_groups * consumer_registers <= threads * (65536 / threads / 8 * 8);
}

template <int kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// ---- thread block clusters ----
__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// Barrier over every thread of the cluster that has not exited: this thread's earlier memory accesses
// (shared memory of other CTAs included) are ordered before what the others do after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Barrier over the `threads` threads that use named barrier `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrival at named barrier `id` without waiting: the executing warp's earlier memory accesses are
// ordered before whatever the threads that bar.sync on the same barrier do after it completes.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace sm90
}  // namespace flashattn
