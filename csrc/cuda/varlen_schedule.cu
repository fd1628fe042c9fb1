// The work lists of a variable-length batch (varlen_schedule.h). One block of kThreads threads builds a
// list: few items per sequence (a block of 64-128 rows each), so the build is a small fraction of the
// attention it schedules.
//
// By cost: the sequences in decreasing order of their heaviest item's cost (key blocks a forward tile
// sees, query rows a backward key block sees), by a counting sort: a histogram of the sequences' item
// counts by cost, its prefix sums from the highest bucket down, then each sequence's items placed at
// its bucket's next range (sequences within a bucket land in any order: the kernels' results do not
// depend on which CTA runs an item). Within a sequence the heads go in sections of as many heads as
// keep the other side's rows (the keys and values a forward tile reads, the queries, output gradients
// and dq rows a backward key block reads) within about half of the L2, and within a section item
// level by level, heaviest first, each level's heads together. So the CTAs running at once read the
// rows of one section's heads (L2 hits), not one head each of many sequences, while the heaviest
// items still come first and the list ends on the lightest ones of the shortest sequences. Costs above
// the last bucket share it.
#include "cuda/varlen_schedule.h"

#include <cstdio>

#include "common/mask.h"
#include "cuda/varlen.h"

// The C library's assertion failure, which CUDA provides in device code too; declared here because
// <assert.h> leaves it out under NDEBUG.
extern "C" __host__ __device__ void __assert_fail(const char*, const char*, unsigned int, const char*) __THROW
    __attribute__((__noreturn__));

namespace flashattn {
namespace {

constexpr int kThreads = 1024;
constexpr int kBuckets = 1024;
// The other side's bytes a section may read: half of the H200's L2, the share the batched forward's
// dynamic tail also keeps (sm90/fwd_schedule.h).
constexpr int64_t kSectionBytes = int64_t{24} << 20;

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

// The block at level `level` of a sequence of `blocks` (level 0 the heaviest): a forward tile's cost
// grows with its query block under causal masking, a backward key block's falls with it; without
// causal masking all cost the same.
__device__ __forceinline__ int block_at_level(const VarlenListSpec& spec, int blocks, int level) {
  return spec.is_causal && spec.work == VarlenWork::kForward ? blocks - 1 - level : level;
}

// A violated promise about the offsets: the message, then a device-side assertion (called directly,
// so that builds with NDEBUG keep it), which stops this launch and the kernels queued after it before
// they read or write a row the offsets would place outside the tensors.
__device__ __noinline__ void offsets_violated(const char* message, int b, int value, int limit) {
  printf("flashattn: %s (sequence %d: %d, limit %d)\n", message, b, value, limit);
  __assert_fail(message, __FILE__, __LINE__, "build_varlen_list");
}

// Checks sequence b's offsets (run once per sequence, by the thread that first reads them): they start
// at 0, never decrease, end at the packed row count, no sequence is longer than the max_seqlen given,
// and seqused_* stays within the sequence.
__device__ __forceinline__ void check_offsets(const VarlenParams& v, int b, int batch) {
  const int q0 = v.cu_seqlens_q[b], q1 = v.cu_seqlens_q[b + 1];
  const int k0 = v.cu_seqlens_k[b], k1 = v.cu_seqlens_k[b + 1];
  if (b == 0 && q0 != 0) offsets_violated("cu_seqlens_q[0] must be 0", b, q0, 0);
  if (b == 0 && k0 != 0) offsets_violated("cu_seqlens_k[0] must be 0", b, k0, 0);
  if (q1 < q0) offsets_violated("cu_seqlens_q must not decrease", b, q1, q0);
  if (k1 < k0) offsets_violated("cu_seqlens_k must not decrease", b, k1, k0);
  if (b == batch - 1 && q1 != v.total_q) offsets_violated("cu_seqlens_q[-1] must be the packed row count", b, q1, v.total_q);
  if (b == batch - 1 && k1 != v.total_k) offsets_violated("cu_seqlens_k[-1] must be the packed row count", b, k1, v.total_k);
  if (v.max_seqlen_q >= 0 && q1 - q0 > v.max_seqlen_q) {
    offsets_violated("a sequence of cu_seqlens_q is longer than max_seqlen_q", b, q1 - q0, v.max_seqlen_q);
  }
  if (v.max_seqlen_k >= 0 && k1 - k0 > v.max_seqlen_k) {
    offsets_violated("a sequence of cu_seqlens_k is longer than max_seqlen_k", b, k1 - k0, v.max_seqlen_k);
  }
  if (v.seqused_q != nullptr && (v.seqused_q[b] < 0 || v.seqused_q[b] > q1 - q0)) {
    offsets_violated("seqused_q must be in [0, the sequence's length]", b, v.seqused_q[b], q1 - q0);
  }
  if (v.seqused_k != nullptr && (v.seqused_k[b] < 0 || v.seqused_k[b] > k1 - k0)) {
    offsets_violated("seqused_k must be in [0, the sequence's length]", b, v.seqused_k[b], k1 - k0);
  }
}

__device__ __forceinline__ int bucket_of(int cost) { return kBuckets - 1 - min(cost, kBuckets - 1); }

// Heads per section of sequence s: whole head groups whose other-side rows fit kSectionBytes, at least one.
__device__ __forceinline__ int section_heads(const SeqSpan& s, const VarlenListSpec& spec) {
  const int64_t rows = spec.work == VarlenWork::kForward ? s.len_k : s.len_q;
  const int64_t bytes = rows * spec.other_row_bytes;
  const int64_t groups = bytes > 0 ? max(kSectionBytes / bytes, int64_t{1}) : spec.heads;
  const int64_t heads = groups * spec.head_group;
  return heads < spec.heads ? static_cast<int>(heads) : spec.heads;
}

__global__ void __launch_bounds__(kThreads) build_by_cost_kernel(const VarlenParams v, const VarlenListSpec spec,
                                                                 int2* items, int* count) {
  __shared__ int slots[kBuckets];  // item counts, then the next free item of each bucket (highest cost first)
  for (int i = threadIdx.x; i < kBuckets; i += kThreads) slots[i] = 0;
  __syncthreads();
  for (int b = threadIdx.x; b < spec.batch; b += kThreads) {
    check_offsets(v, b, spec.batch);
    const SeqSpan s = SeqSpan::of(v, b);
    const int blocks = blocks_of(s, spec);
    if (blocks > 0) {
      const int heaviest = cost_of(s, spec, block_at_level(spec, blocks, 0));
      atomicAdd(&slots[bucket_of(heaviest)], blocks * spec.heads);
    }
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
  // A warp per sequence: its first lane takes the sequence's range, the lanes write its items.
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (int b = warp; b < spec.batch; b += kThreads / 32) {
    const SeqSpan s = SeqSpan::of(v, b);
    const int blocks = blocks_of(s, spec);
    if (blocks == 0) continue;
    const int n = blocks * spec.heads;
    int first = 0;
    if (lane == 0) first = atomicAdd(&slots[bucket_of(cost_of(s, spec, block_at_level(spec, blocks, 0)))], n);
    first = __shfl_sync(0xffffffffu, first, 0);
    const int per_section = section_heads(s, spec);
    for (int i = lane; i < n; i += 32) {
      // Item i: section i / (per_section * blocks), then level, then head within the section (the
      // last section may have fewer heads).
      const int section = i / (per_section * blocks);
      const int in_section = i - section * per_section * blocks;
      const int heads_here = min(per_section, spec.heads - section * per_section);
      const int level = in_section / heads_here;
      const int head = section * per_section + (in_section - level * heads_here);
      items[first + i] = make_int2(b, block_at_level(spec, blocks, level) * spec.heads + head);
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
      check_offsets(v, b, spec.batch);
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
