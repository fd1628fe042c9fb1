// The work lists of a variable-length batch (varlen_schedule.h). One block of kThreads threads builds a
// list: few items per sequence (a block of 64-128 rows each), so the build is a small fraction of the
// attention it schedules.
//
// By cost: a counting sort on the item's cost (key blocks a forward tile sees, query rows a backward
// key block sees), descending: a histogram of the costs, its prefix sums from the highest bucket down,
// then every item placed at its bucket's next slot. Items within a bucket land in any order (the
// kernels' results do not depend on which CTA runs an item). Costs above the last bucket share it.
#include "cuda/varlen_schedule.h"

#include "common/mask.h"
#include "cuda/varlen.h"

namespace flashattn {
namespace {

constexpr int kThreads = 1024;
constexpr int kBuckets = 1024;

// Blocks of sequence b's enumerated side, and the span.
__device__ __forceinline__ int blocks_of(const SeqSpan& s, const VarlenListSpec& spec) {
  const int rows = spec.work == VarlenWork::kForward ? s.len_q : s.len_k;
  return rows > 0 ? (rows + spec.block_rows - 1) / spec.block_rows : 0;
}

// The cost of block `block` of sequence span s.
__device__ __forceinline__ int cost_of(const SeqSpan& s, const VarlenListSpec& spec, int block) {
  if (spec.work == VarlenWork::kForward) {
    const int m0 = block * spec.block_rows;
    const int end = visible_key_end(min(m0 + spec.block_rows, s.len_q), s.len_k, spec.is_causal, s.causal_offset);
    return end > 0 ? (end + spec.cost_rows - 1) / spec.cost_rows : 0;
  }
  const int first = first_query_seeing(block * spec.block_rows, spec.is_causal, s.causal_offset);
  return first < s.len_q ? (s.len_q - first + spec.cost_rows - 1) / spec.cost_rows : 0;
}

__device__ __forceinline__ int bucket_of(int cost) { return kBuckets - 1 - min(cost, kBuckets - 1); }

__global__ void __launch_bounds__(kThreads) build_by_cost_kernel(const VarlenParams v, const VarlenListSpec spec,
                                                                 int2* items, int* count) {
  __shared__ int slots[kBuckets];  // counts, then the next free slot of each bucket (highest cost first)
  for (int i = threadIdx.x; i < kBuckets; i += kThreads) slots[i] = 0;
  __syncthreads();
  for (int b = threadIdx.x; b < spec.batch; b += kThreads) {
    const SeqSpan s = SeqSpan::of(v, b);
    const int blocks = blocks_of(s, spec);
    for (int block = 0; block < blocks; ++block) atomicAdd(&slots[bucket_of(cost_of(s, spec, block))], spec.heads);
  }
  __syncthreads();
  // Exclusive prefix sums over the buckets (kThreads == kBuckets: one per thread), Hillis-Steele.
  static_assert(kThreads == kBuckets, "one bucket per thread");
  const int own = slots[threadIdx.x];
  int sum = own;
  for (int offset = 1; offset < kBuckets; offset *= 2) {
    __syncthreads();
    const int left = threadIdx.x >= offset ? slots[threadIdx.x - offset] : 0;
    __syncthreads();
    sum += left;
    slots[threadIdx.x] = sum;
  }
  __syncthreads();
  slots[threadIdx.x] = sum - own;
  if (threadIdx.x == kThreads - 1) *count = sum;
  __syncthreads();
  for (int b = threadIdx.x; b < spec.batch; b += kThreads) {
    const SeqSpan s = SeqSpan::of(v, b);
    const int blocks = blocks_of(s, spec);
    for (int block = 0; block < blocks; ++block) {
      const int at = atomicAdd(&slots[bucket_of(cost_of(s, spec, block))], spec.heads);
      for (int h = 0; h < spec.heads; ++h) items[at + h] = make_int2(b, block * spec.heads + h);
    }
  }
}

// In sequence order: each chunk of kThreads sequences takes its offsets from a block-wide prefix sum
// of their item counts.
__global__ void __launch_bounds__(kThreads) build_in_order_kernel(const VarlenParams v, const VarlenListSpec spec,
                                                                  int2* items, int* count) {
  __shared__ int sums[kThreads];
  int base = 0;
  for (int chunk = 0; chunk < spec.batch; chunk += kThreads) {
    const int b = chunk + static_cast<int>(threadIdx.x);
    SeqSpan s{};
    int blocks = 0;
    if (b < spec.batch) {
      s = SeqSpan::of(v, b);
      blocks = blocks_of(s, spec);
    }
    const int own = blocks * spec.heads;
    int sum = own;
    sums[threadIdx.x] = sum;
    for (int offset = 1; offset < kThreads; offset *= 2) {
      __syncthreads();
      const int left = threadIdx.x >= offset ? sums[threadIdx.x - offset] : 0;
      __syncthreads();
      sum += left;
      sums[threadIdx.x] = sum;
    }
    __syncthreads();
    const int first = base + sum - own;
    for (int h = 0; h < spec.heads; ++h) {
      for (int i = 0; i < blocks; ++i) {
        const int block = spec.is_causal ? blocks - 1 - i : i;
        items[first + h * blocks + i] = make_int2(b, block * spec.heads + h);
      }
    }
    base += sums[kThreads - 1];
    __syncthreads();  // sums is rewritten by the next chunk
  }
  if (threadIdx.x == 0) *count = base;
}

}  // namespace

cudaError_t build_varlen_list(const VarlenParams& varlen, const VarlenListSpec& spec, int2* items, int* count,
                              cudaStream_t stream) {
  if (spec.batch < 0 || spec.heads < 1 || spec.block_rows < 1 || spec.cost_rows < 1) return cudaErrorInvalidValue;
  if (spec.by_cost) {
    build_by_cost_kernel<<<1, kThreads, 0, stream>>>(varlen, spec, items, count);
  } else {
    build_in_order_kernel<<<1, kThreads, 0, stream>>>(varlen, spec, items, count);
  }
  return cudaGetLastError();
}

}  // namespace flashattn
