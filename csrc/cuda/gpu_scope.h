// Acquire / release at GPU scope, for counters through which CTAs take turns (the backward's
// deterministic dq reductions, on both GPU paths).
#pragma once

namespace flashattn {

// Load with acquire semantics at GPU scope: this thread's later memory operations are ordered after it,
// so they see everything the writer released. Volatile, so a spin loop re-reads it every iteration.
__device__ __forceinline__ int ld_acquire_gpu(const int* ptr) {
  int value;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(value) : "l"(ptr) : "memory");
  return value;
}

// Atomic add with release semantics at GPU scope: this thread's earlier memory operations (and, after a
// barrier, those of its CTA) are visible to whoever acquires the new value.
__device__ __forceinline__ void red_add_release_gpu(int* ptr, int value) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(ptr), "r"(value) : "memory");
}

}  // namespace flashattn
