// The decode kernel: attention of a few queries per sequence over a (paged) key/value cache, each
// sequence's keys split across thread blocks (split-KV), the query heads of one kv head computed
// together so the keys and values are read once for the whole group (GQA packing).
//
// Decoding reads the whole cache for one or a few queries: it is bound by memory bandwidth, not by the
// tensor cores. So the kernel is built for bytes in flight: thread block (row group, split, kv head,
// sequence) has kWarps warps, each streaming its own 16-key blocks of K and V into a private ring
// of cp.async stages (a key row at a time, so any page size and any page order cost the same), while
// mma.sync m16n8k16 computes S = Q K^T and O += P V for the 16 query rows of the block's group. The
// warps merge their online-softmax states through shared memory at the end. With one split the
// thread block writes out and lse; with several it writes a normalised partial and its LSE, and
// decode_combine_kernel merges the splits.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/softcap.h"
#include "decode/decode_config.h"
#include "params.h"
#include "sm80/fragments.h"
#include "sm80/ptx.h"

namespace flashattn {
namespace decode {

// Sequence b's queries: rows start .. start + count of q and out.
struct QueryRows {
  int start;
  int count;
};

__device__ __forceinline__ QueryRows query_rows(const DecodeParams& p, int b) {
  if (p.cu_seqlens_q == nullptr) return {0, p.seqlen_q};
  const int start = p.cu_seqlens_q[b];
  return {start, max(min(p.cu_seqlens_q[b + 1] - start, p.seqlen_q), 0)};
}

// Element of lse for (sequence b, query head, query of the sequence).
__device__ __forceinline__ int64_t lse_index(const DecodeParams& p, int b, const QueryRows& qr, int head, int query) {
  if (p.cu_seqlens_q != nullptr) return static_cast<int64_t>(head) * p.total_q + qr.start + query;
  return (static_cast<int64_t>(b) * p.heads_q + head) * p.seqlen_q + query;
}

// Where sequence b's keys are and which of them this thread block takes.
struct KeyRange {
  int length;  // keys of the sequence
  int begin;   // this split's keys: [begin, end), within the keys some row of the sequence may see
  int end;
};

__device__ __forceinline__ KeyRange key_range(const DecodeParams& p, int b, int split, int queries) {
  const int capacity = p.block_table != nullptr ? p.pages_per_seq * p.page_size : p.page_size;
  KeyRange r;
  r.length = min(max(p.seqlens_k[b], 0), capacity);
  // The first key any row may see: the left padding's end, and the window of the lowest diagonal (query 0's).
  int lo = p.leftpad != nullptr ? min(max(p.leftpad[b], 0), r.length) : 0;
  if (p.window_left >= 0) lo = max(lo, r.length - queries - p.window_left);
  const int keys = max(r.length - lo, 0);
  // Whole key blocks per split, so only a split's last block is partial.
  const int per_split = (keys + p.num_splits - 1) / p.num_splits;
  const int chunk = (per_split + kBlockKeys - 1) / kBlockKeys * kBlockKeys;
  r.begin = min(lo + split * chunk, r.length);
  r.end = min(r.begin + chunk, r.length);
  return r;
}

// The keys [first, last] (inclusive) query row r of the group sees within the split; first > last for a
// row past the group's rows (rows of the sequence's `queries`) or one that sees none.
__device__ __forceinline__ void row_keys(const DecodeParams& p, const KeyRange& kr, int r, int rows, int group,
                                         int queries, int& first, int& last) {
  first = kr.begin;
  last = kr.end - 1;
  if (r >= rows) {
    last = first - 1;
    return;
  }
  const int diagonal = kr.length - queries + r / group;
  if (p.is_causal) last = min(last, diagonal);
  if (p.window_right >= 0 && !p.is_causal) last = min(last, diagonal + p.window_right);
  if (p.window_left >= 0) first = max(first, diagonal - p.window_left);
}

// One 16-key block of K and V into a ring stage, whole rows per instruction: consecutive lanes take
// consecutive 16-byte chunks of the block (512 contiguous bytes an instruction at width 128, two rows),
// where a lane pair per row made each instruction touch 16 rows 32 bytes apart, so fewer, fuller memory
// requests.
//
// A paged cache: row r's source offsets come from lane r (a page lookup, with its division, once per
// row) and reach the lanes that copy the row by shuffles.
template <typename T, int kWidth>
__device__ __forceinline__ void load_paged_rows(const DecodeParams& p, T* k_tile, T* v_tile, int b, int kv_head,
                                                int key0, int key_end, int lane) {
  constexpr int kStride = stride_for(kWidth);
  constexpr int kChunks = kWidth / 8;  // 16-byte chunks of a row
  static_assert(kBlockKeys * kChunks % 32 == 0, "whole instructions per block");
  const int key = key0 + lane % kBlockKeys;
  bool valid = key < key_end;
  int page = 0, page_row = 0;
  if (valid) {
    const int slot = key / p.page_size;
    page = p.block_table[b * p.block_table_stride + slot];
    page_row = key - slot * p.page_size;
  }
  valid = valid && page >= 0 && page < p.num_pages;
  // Element offsets of row lane % 16 in k and v, -1 for a row outside the cache (zeros).
  const int64_t k_off = valid ? page * p.k_strides.batch + page_row * p.k_strides.row + kv_head * p.k_strides.head : -1;
  const int64_t v_off = valid ? page * p.v_strides.batch + page_row * p.v_strides.row + kv_head * p.v_strides.head : -1;
  const T* k_base = static_cast<const T*>(p.k);
  const T* v_base = static_cast<const T*>(p.v);
#pragma unroll
  for (int i = 0; i < kBlockKeys * kChunks / 32; ++i) {
    const int chunk = lane + 32 * i, row = chunk / kChunks, c = chunk % kChunks;
    const int64_t ko = __shfl_sync(0xffffffff, k_off, row), vo = __shfl_sync(0xffffffff, v_off, row);
    const bool in = ko >= 0 && c * 8 < p.head_dim;
    sm80::cp_async_16(k_tile + row * kStride + c * 8, k_base + (in ? ko + c * 8 : 0), in);
    sm80::cp_async_16(v_tile + row * kStride + c * 8, v_base + (in ? vo + c * 8 : 0), in);
  }
}

// A contiguous cache (one cache row a sequence): no lookup and no shuffle. Where a copy instruction
// covers whole rows (widths 64, 128, 256), each lane keeps one column chunk and steps its source pointer
// by the rows an instruction covers, so a copy costs a pointer addition and a compare.
// k_rows / v_rows: key 0 of the sequence's cache row at this kv head; rows at or past key_end read zeros.
template <typename T, int kWidth>
__device__ __forceinline__ void load_contiguous_rows(const DecodeParams& p, T* k_tile, T* v_tile, const T* k_rows,
                                                     const T* v_rows, int key0, int key_end, int lane) {
  constexpr int kStride = stride_for(kWidth);
  constexpr int kChunks = kWidth / 8;
  constexpr int kCopies = kBlockKeys * kChunks / 32;  // copy instructions per tensor and block
  static_assert(kBlockKeys * kChunks % 32 == 0, "whole instructions per block");
  const int rows_left = key_end - key0;
  if constexpr (32 % kChunks == 0) {
    constexpr int kRowsPerCopy = 32 / kChunks;
    const int row = lane / kChunks, c = lane % kChunks;
    const bool col_in = c * 8 < p.head_dim;
    const T* k_src = k_rows + static_cast<int64_t>(key0 + row) * p.k_strides.row + c * 8;
    const T* v_src = v_rows + static_cast<int64_t>(key0 + row) * p.v_strides.row + c * 8;
    const int64_t k_step = kRowsPerCopy * p.k_strides.row, v_step = kRowsPerCopy * p.v_strides.row;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int r = row + kRowsPerCopy * i;
      const bool in = col_in && r < rows_left;
      sm80::cp_async_16(k_tile + r * kStride + c * 8, in ? k_src : k_rows, in);
      sm80::cp_async_16(v_tile + r * kStride + c * 8, in ? v_src : v_rows, in);
      k_src += k_step;
      v_src += v_step;
    }
  } else {
    const T* k_block = k_rows + static_cast<int64_t>(key0) * p.k_strides.row;
    const T* v_block = v_rows + static_cast<int64_t>(key0) * p.v_strides.row;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int chunk = lane + 32 * i, r = chunk / kChunks, c = chunk % kChunks;
      const bool in = r < rows_left && c * 8 < p.head_dim;
      sm80::cp_async_16(k_tile + r * kStride + c * 8, in ? k_block + r * p.k_strides.row + c * 8 : k_rows, in);
      sm80::cp_async_16(v_tile + r * kStride + c * 8, in ? v_block + r * p.v_strides.row + c * 8 : v_rows, in);
    }
  }
}

template <typename T, int kWidth, int kStages>
__global__ void __launch_bounds__(kWarps * 32) decode_kernel(const DecodeParams p) {
  static_assert(kStages >= 2 && has_stages(kWidth, kStages), "a ring depth decode_config.h lists");
  constexpr int kStride = stride_for(kWidth);
  constexpr int kKSteps = kWidth / 16;   // k-steps of QK^T, n-tile pairs of PV
  constexpr int kOTiles = kWidth / 8;    // n8 tiles of O
  // Q's fragments take 4 registers a k-step; at the widest widths they are read from shared memory
  // each block instead, leaving the registers to O.
  constexpr bool kQInRegisters = kWidth <= 128;
  constexpr float kLn2 = 0.69314718055994530942f;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* rings = reinterpret_cast<T*>(smem_raw);  // [kWarps][kStages][K, V][kBlockKeys][kStride]
  T* q_tile = rings + kWarps * kStages * 2 * kBlockKeys * kStride;  // [kRows][kStride]

  const int group = p.heads_q / p.heads_kv;
  // Query rows of one kv head: row r = query r / group, head r % group (the grid covers seqlen_q queries).
  const int row_groups = (group * p.seqlen_q + kRows - 1) / kRows;
  int index = blockIdx.x;
  const int row_group = index % row_groups;
  index /= row_groups;
  const int split = index % p.num_splits;
  index /= p.num_splits;
  const int kv_head = index % p.heads_kv;
  const int b = index / p.heads_kv;
  const int row0 = row_group * kRows;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The combine kernel may be scheduled from here on; it waits for this grid's completion itself.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const QueryRows qr = query_rows(p, b);
  const int rows = group * qr.count;
  if (row0 >= rows) return;  // a row block past this sequence's queries (fewer than the grid's seqlen_q)
  const KeyRange kr = key_range(p, b, split, qr.count);
  const int cache_row =
      p.block_table != nullptr ? 0 : (p.cache_batch_idx != nullptr ? p.cache_batch_idx[b] : b);

  // out / partial row of group row r.
  auto out_row = [&](int r) -> T* {
    const int query = qr.start + r / group, head = kv_head * group + r % group;
    return static_cast<T*>(p.out) + b * p.out_strides.batch + query * p.out_strides.row + head * p.out_strides.head;
  };
  auto lse_at = [&](int r) -> float* { return p.lse + lse_index(p, b, qr, kv_head * group + r % group, r / group); };
  const int64_t unit = static_cast<int64_t>(b) * p.heads_kv + kv_head;
  const int max_rows = group * p.seqlen_q;  // a unit's rows in the partial workspace
  auto partial_index = [&](int r) -> int64_t {
    return (static_cast<int64_t>(split) * p.batch * p.heads_kv + unit) * max_rows + r;
  };

  // Q rows of the group into shared memory (zeros past the group's rows and the head dim).
  for (int i = tid; i < kRows * (kWidth / 8); i += kWarps * 32) {
    const int rr = i / (kWidth / 8), c = i % (kWidth / 8), r = row0 + rr;
    const bool in = r < rows && c * 8 < p.head_dim;
    const T* src = static_cast<const T*>(p.q);
    if (in) {
      src += b * p.q_strides.batch + (qr.start + r / group) * p.q_strides.row +
             (kv_head * group + r % group) * p.q_strides.head + c * 8;
    }
    sm80::cp_async_16(q_tile + rr * kStride + c * 8, src, in);
  }
  sm80::cp_async_commit();

  // This thread's two rows (g and g + 8 of the mma fragments) and the keys each sees.
  const int g = lane / 4, t = lane % 4;
  int first[2], last[2];
  row_keys(p, kr, row0 + g, rows, group, qr.count, first[0], last[0]);
  row_keys(p, kr, row0 + g + 8, rows, group, qr.count, first[1], last[1]);

  // ALiBi: each of the two rows' slope in base-2 units, negated (0 without), and diagonal position.
  float alibi_slope[2] = {0.f, 0.f}, alibi_diagonal[2] = {0.f, 0.f};
  if (p.alibi_slopes != nullptr) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + g + 8 * h;
      if (r >= rows) continue;
      const float slope = p.alibi_slopes[static_cast<int64_t>(b) * p.alibi_batch_stride + kv_head * group + r % group];
      alibi_slope[h] = -slope * (1.f / kLn2);
      alibi_diagonal[h] = static_cast<float>(kr.length - qr.count + r / group);
    }
  }

  // Scores that need only the scale (no softcap, no ALiBi): the key loop's common form.
  const bool plain_scores = p.softcap_inner == 0.f && p.alibi_slopes == nullptr;
  float o[kOTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  // Warp w's key blocks start at begin + 16 (w + kWarps i).
  const int key_first = kr.begin + warp * kBlockKeys;
  constexpr int kKeyStep = kWarps * kBlockKeys;
  const int blocks = kr.end > key_first ? (kr.end - key_first + kKeyStep - 1) / kKeyStep : 0;
  T* ring = rings + warp * kStages * 2 * kBlockKeys * kStride;
  auto k_stage = [&](int s) { return ring + s * 2 * kBlockKeys * kStride; };
  auto v_stage = [&](int s) { return k_stage(s) + kBlockKeys * kStride; };
  // A contiguous cache row outside the cache (cache_batch_idx) reads as zeros: no keys to load.
  const bool paged = p.block_table != nullptr;
  const int key_end = paged || (cache_row >= 0 && cache_row < p.num_pages) ? kr.end : kr.begin;
  const T* k_rows = static_cast<const T*>(p.k) + kv_head * p.k_strides.head;
  const T* v_rows = static_cast<const T*>(p.v) + kv_head * p.v_strides.head;
  if (!paged) {
    const int64_t row = key_end > kr.begin ? cache_row : 0;
    k_rows += row * p.k_strides.batch;
    v_rows += row * p.v_strides.batch;
  }
  // A paged cache whose pages hold whole 16-key blocks (page size a multiple of 16, the split starting on a
  // block boundary) has each block in one page: it is copied as a contiguous cache's block is, from that
  // page, and its table entry is read a block ahead of the copy, so the lookup's latency hides behind a
  // block's work. Other page sizes look up each row (load_paged_rows), and so does width 256, whose
  // registers (O alone takes 128) the look-ahead would overflow into local memory.
  const bool whole_pages = kWidth < 256 && paged && p.page_size % kBlockKeys == 0 && kr.begin % kBlockKeys == 0;
  // Block i's page and its first row there ({-1, 0} past the warp's blocks or without whole_pages).
  auto page_of = [&](int i) -> int2 {
    if (!whole_pages || i >= blocks) return make_int2(-1, 0);
    const int key0 = key_first + i * kKeyStep, slot = key0 / p.page_size;
    return make_int2(p.block_table[b * p.block_table_stride + slot], key0 - slot * p.page_size);
  };
  auto load = [&](int i, int2 page) {
    const int s = i % kStages, key0 = key_first + i * kKeyStep;
    if (whole_pages) {
      // A table entry outside the pool reads zeros, as load_paged_rows's rows do.
      const bool in_pool = page.x >= 0 && page.x < p.num_pages;
      const int64_t at = in_pool ? page.x : 0;
      const int rows = in_pool ? key_end - key0 : 0;
      load_contiguous_rows<T, kWidth>(p, k_stage(s), v_stage(s), k_rows + at * p.k_strides.batch,
                                      v_rows + at * p.v_strides.batch, page.y, page.y + rows, lane);
    } else if (paged) {
      load_paged_rows<T, kWidth>(p, k_stage(s), v_stage(s), b, kv_head, key0, key_end, lane);
    } else {
      load_contiguous_rows<T, kWidth>(p, k_stage(s), v_stage(s), k_rows, v_rows, key0, key_end, lane);
    }
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < blocks) load(i, page_of(i));
    sm80::cp_async_commit();
  }
  int2 page_ahead = page_of(kStages - 1);  // the page of the next block to copy

  // Q's fragments (the Q tile's group was committed first, so it is complete once block 0's is).
  uint32_t qa[kQInRegisters ? kKSteps : 1][4];
  sm80::cp_async_wait<kStages - 2>();
  __syncthreads();
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) sm80::load_a<kStride>(qa[ks], q_tile, 0, ks * 16, lane);
  }

  for (int i = 0; i < blocks; ++i) {
    sm80::cp_async_wait<kStages - 2>();
    __syncwarp();
    const T* k_tile = k_stage(i % kStages);
    const T* v_tile = v_stage(i % kStages);
    const int key0 = key_first + i * kKeyStep;

    float s[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t bk[4];
      sm80::load_b_from_rows_nk<kStride>(bk, k_tile, 0, ks * 16, lane);
      if constexpr (kQInRegisters) {
        sm80::mma_m16n8k16<T>(s[0], qa[ks], bk[0], bk[1]);
        sm80::mma_m16n8k16<T>(s[1], qa[ks], bk[2], bk[3]);
      } else {
        uint32_t a[4];
        sm80::load_a<kStride>(a, q_tile, 0, ks * 16, lane);
        sm80::mma_m16n8k16<T>(s[0], a, bk[0], bk[1]);
        sm80::mma_m16n8k16<T>(s[1], a, bk[2], bk[3]);
      }
    }

    // Scores in base 2, keys outside each row's range at -inf; then the online softmax of rows g, g + 8.
    // A block inside the range of every row of the warp (rows past the group's rows, whose outputs are
    // never written, count as inside) needs no per-key test: a uniform branch.
    const bool inside = (key0 >= first[0] && key0 + kBlockKeys - 1 <= last[0]) || row0 + g >= rows;
    const bool inside8 = (key0 >= first[1] && key0 + kBlockKeys - 1 <= last[1]) || row0 + g + 8 >= rows;
    const bool whole = __all_sync(0xffffffff, inside && inside8);
    float row_max[2] = {-INFINITY, -INFINITY};
    if (whole && plain_scores) {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] *= p.scale_log2;
          row_max[e / 2] = fmaxf(row_max[e / 2], s[n][e]);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          const int key = key0 + n * 8 + 2 * t + e % 2;
          float x = s[n][e];
          if (p.softcap_inner != 0.f) x = tanh_approx(x * p.softcap_inner);
          x *= p.scale_log2;
          if (p.alibi_slopes != nullptr) {
            x = fmaf(alibi_slope[h], fabsf(alibi_diagonal[h] - static_cast<float>(key)), x);
          }
          if (!whole) x = (key >= first[h] && key <= last[h]) ? x : -INFINITY;
          s[n][e] = x;
          row_max[h] = fmaxf(row_max[h], x);
        }
      }
    }
    float new_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) new_max[h] = fmaxf(m[h], sm80::quad_max(row_max[h]));
    // O and l are rescaled only when some row of the warp has a larger maximum (after a cache's first
    // blocks, rarely): a row whose maximum stays has the factor exp2(0) = 1 exactly, and one that has
    // seen no key yet has O and l still 0, so skipping changes no bit.
    if (__any_sync(0xffffffff, new_max[0] > m[0] || new_max[1] > m[1])) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float rescale = new_max[h] == -INFINITY ? 1.f : exp2f(m[h] - new_max[h]);
        l[h] *= rescale;
#pragma unroll
        for (int n = 0; n < kOTiles; ++n) {
          o[n][2 * h] *= rescale;
          o[n][2 * h + 1] *= rescale;
        }
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[h] = new_max[h];
      // A row that has seen no key yet keeps max -inf; subtracting 0 keeps its exponentials at 0, not NaN.
      const float base = new_max[h] == -INFINITY ? 0.f : new_max[h];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        s[n][2 * h] = exp2f(s[n][2 * h] - base);
        s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - base);
        l[h] += s[n][2 * h] + s[n][2 * h + 1];
      }
    }

    uint32_t pa[4];
    sm80::accumulator_to_a<T>(pa, s[0], s[1]);
#pragma unroll
    for (int np = 0; np < kKSteps; ++np) {
      uint32_t bv[4];
      sm80::load_b_from_rows_kn<kStride>(bv, v_tile, 0, np * 16, lane);
      sm80::mma_m16n8k16<T>(o[2 * np], pa, bv[0], bv[1]);
      sm80::mma_m16n8k16<T>(o[2 * np + 1], pa, bv[2], bv[3]);
    }

    __syncwarp();  // every lane has read this stage before it is refilled
    if (i + kStages - 1 < blocks) load(i + kStages - 1, page_ahead);
    sm80::cp_async_commit();
    page_ahead = page_of(i + kStages);
  }
  l[0] = sm80::quad_sum(l[0]);
  l[1] = sm80::quad_sum(l[1]);

  // Merge the warps: each writes its state over the (drained) rings, then every thread combines
  // elements of all warps.
  sm80::cp_async_wait<0>();
  __syncthreads();
  float* merge = reinterpret_cast<float*>(smem_raw);  // [kWarps][kRows][kWidth + 2]: O, then max and sum
  constexpr int kMergeRow = kWidth + 2;
  {
    float* mine = merge + warp * kRows * kMergeRow;
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
      mine[g * kMergeRow + n * 8 + 2 * t] = o[n][0];
      mine[g * kMergeRow + n * 8 + 2 * t + 1] = o[n][1];
      mine[(g + 8) * kMergeRow + n * 8 + 2 * t] = o[n][2];
      mine[(g + 8) * kMergeRow + n * 8 + 2 * t + 1] = o[n][3];
    }
    if (t == 0) {
      mine[g * kMergeRow + kWidth] = m[0];
      mine[g * kMergeRow + kWidth + 1] = l[0];
      mine[(g + 8) * kMergeRow + kWidth] = m[1];
      mine[(g + 8) * kMergeRow + kWidth + 1] = l[1];
    }
  }
  __syncthreads();

  // Thread tid takes row tid / 8 (16 rows, 8 threads each) and every 8th column pair of it.
  const int r = tid / 8, lane8 = tid % 8;
  const int row = row0 + r;
  if (row >= rows) return;
  float max_all = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) max_all = fmaxf(max_all, merge[(w * kRows + r) * kMergeRow + kWidth]);
  // A sink joins the row's denominator here when this block is the row's only split (base 2).
  const bool with_sink = p.sink != nullptr && p.num_splits == 1;
  const float sink_log2 = with_sink ? p.sink[kv_head * group + row % group] * (1.f / kLn2) : -INFINITY;
  max_all = fmaxf(max_all, sink_log2);
  const float base = max_all == -INFINITY ? 0.f : max_all;
  float weight[kWarps], sum = with_sink ? exp2f(sink_log2 - base) : 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = exp2f(merge[(w * kRows + r) * kMergeRow + kWidth] - base);
    sum += weight[w] * merge[(w * kRows + r) * kMergeRow + kWidth + 1];
  }
  // Natural-log LSE of the row over this split's keys; -inf (and out 0) for a row that saw none.
  const float lse = sum > 0.f ? (base + log2f(sum)) * kLn2 : -INFINITY;
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  // Columns c, c + 1 of the row's merged output, normalised.
  auto merged = [&](int c) {
    float acc0 = 0.f, acc1 = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      acc0 += weight[w] * merge[(w * kRows + r) * kMergeRow + c];
      acc1 += weight[w] * merge[(w * kRows + r) * kMergeRow + c + 1];
    }
    return make_float2(acc0 * inv, acc1 * inv);
  };
  if (p.num_splits == 1) {
    T* dst = out_row(row);
    for (int c = 2 * lane8; c < p.head_dim; c += 16) {
      const float2 x = merged(c);
      *reinterpret_cast<uint32_t*>(dst + c) = ElementOps<T>::pack(x.x, x.y);
    }
    if (lane8 == 0) *lse_at(row) = lse;
  } else {
    float* dst = p.partial_out + partial_index(row) * p.head_dim;
    for (int c = 2 * lane8; c < p.head_dim; c += 16) *reinterpret_cast<float2*>(dst + c) = merged(c);
    if (lane8 == 0) p.partial_lse[partial_index(row)] = lse;
  }
}

// Merges the splits' partial outputs: one warp per (sequence, kv head, group row).
template <typename T>
__global__ void __launch_bounds__(128) decode_combine_kernel(const DecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the decode kernel on sm90 (its launch overlaps that
  // kernel's last blocks): wait here until the decode kernel has finished and its writes are visible.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int group = p.heads_q / p.heads_kv;
  const int rows = group * p.seqlen_q;  // a unit's rows in the partial workspace
  const int64_t units = static_cast<int64_t>(p.batch) * p.heads_kv;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (item >= units * rows) return;
  const int64_t unit = item / rows;
  const int r = static_cast<int>(item % rows);
  const int b = static_cast<int>(unit / p.heads_kv), kv_head = static_cast<int>(unit % p.heads_kv);
  const QueryRows qr = query_rows(p, b);
  if (r >= group * qr.count) return;  // past the sequence's queries: no partial, no output row
  const int64_t split_stride = units * rows;

  const int query = r / group, head = kv_head * group + r % group;
  // The row's sink (natural log), added to the denominator once, here.
  const float sink = p.sink != nullptr ? p.sink[head] : -INFINITY;
  float max_lse = sink;
  for (int s = lane; s < p.num_splits; s += 32) max_lse = fmaxf(max_lse, p.partial_lse[item + s * split_stride]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffff, max_lse, off));
  float sum = 0.f;
  for (int s = lane; s < p.num_splits; s += 32) {
    const float x = p.partial_lse[item + s * split_stride];
    if (x != -INFINITY) sum += __expf(x - max_lse);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffff, sum, off);
  if (sink != -INFINITY) sum += __expf(sink - max_lse);
  T* dst = static_cast<T*>(p.out) + b * p.out_strides.batch + (qr.start + query) * p.out_strides.row +
           head * p.out_strides.head;
  for (int c = 4 * lane; c < p.head_dim; c += 128) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < p.num_splits; ++s) {
      const float x = p.partial_lse[item + s * split_stride];
      if (x == -INFINITY) continue;  // an empty split's partial output was never written
      const float w = __expf(x - max_lse) / sum;
      const float4 part = *reinterpret_cast<const float4*>(p.partial_out + (item + s * split_stride) * p.head_dim + c);
      acc.x += w * part.x;
      acc.y += w * part.y;
      acc.z += w * part.z;
      acc.w += w * part.w;
    }
    *reinterpret_cast<uint32_t*>(dst + c) = ElementOps<T>::pack(acc.x, acc.y);
    *reinterpret_cast<uint32_t*>(dst + c + 2) = ElementOps<T>::pack(acc.z, acc.w);
  }
  if (lane == 0) p.lse[lse_index(p, b, qr, head, query)] = sum > 0.f ? max_lse + logf(sum) : -INFINITY;
}

}  // namespace decode
}  // namespace flashattn
