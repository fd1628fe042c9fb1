// The dropout keep-mask: which (query, key) probabilities survive dropout. Shared by the CPU and GPU
// paths, so that every kernel (forward and backward, any tiling) and the keep-mask op agree bit for bit.
//
// The mask is a pure function of (seed, offset, batch * heads_q + head, query, key): one
// Philox4x32-10 call per aligned 2 x 2 block of (query, key) gives four 32-bit words, the word
// 2 * (query % 2) + (key % 2) belongs to that element, and the element is kept iff its word is at
// least `threshold` = floor(p * 2^32). A kept probability is scaled by 1 / (1 - p).
//
// Counter = (key / 2, query / 2, batch * heads_q + head, low 32 bits of offset); Philox key = the
// 64-bit seed. Seed and offset come from a [2] int64 tensor (rng_state) drawn from torch's generator,
// so a kernel reads them from device memory and CUDA-graph replays draw new ones.
#pragma once

#include <cstdint>

#include "common/mask.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn {

struct PhiloxWords {
  uint32_t w[4];
};

FLASHATTN_HOST_DEVICE uint32_t mul_hi_u32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
FLASHATTN_HOST_DEVICE PhiloxWords philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                               uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mul_hi_u32(kMul0, c0), lo0 = kMul0 * c0;
    const uint32_t hi1 = mul_hi_u32(kMul1, c2), lo1 = kMul1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return PhiloxWords{{c0, c1, c2, c3}};
}

// Dropout of one call, as the kernels see it.
struct DropoutParams {
  bool enabled = false;
  uint32_t threshold = 0;              // keep iff the element's word >= threshold
  float keep_scale = 1.f;              // 1 / (1 - p)
  const int64_t* rng_state = nullptr;  // [2] on the op's device: seed, offset
  uint32_t key_base = 0;               // index of the kernel's key 0 in the op's keys (key-range passes); even
};

// threshold for probability p in [0, 1): floor(p * 2^32), at most 2^32 - 1.
inline uint32_t dropout_threshold(double p) {
  const double scaled = p * 4294967296.0;
  return scaled >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(scaled);
}

// The four words of the aligned 2 x 2 block holding (query, key) of row group `bh` (batch * heads_q + head).
FLASHATTN_HOST_DEVICE PhiloxWords dropout_block_words(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t query,
                                                      uint32_t key) {
  return philox4x32_10(key >> 1, query >> 1, bh, static_cast<uint32_t>(offset), static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32));
}

// The word of (query, key) inside its block's words (selects, not an indexed load: an array indexed by
// a runtime value would live in local memory inside a kernel).
FLASHATTN_HOST_DEVICE uint32_t dropout_word(const PhiloxWords& words, uint32_t query, uint32_t key) {
  const uint32_t even_query = (key & 1) ? words.w[1] : words.w[0];
  const uint32_t odd_query = (key & 1) ? words.w[3] : words.w[2];
  return (query & 1) ? odd_query : even_query;
}

// The keep-mask of one (batch, query head) inside a kernel: seed and offset read once from rng_state.
struct DropoutRow {
  uint64_t seed, offset;
  uint32_t bh, threshold, key_base;

  DropoutRow() = default;
#if defined(__CUDACC__)
  // Volatile loads: the compiler may not hoist them out of a kernel's key-block loop, where seed and
  // offset would hold registers for the whole loop.
  __device__ __forceinline__ DropoutRow(const DropoutParams& d, int batch, int heads_q, int head)
      : seed(static_cast<uint64_t>(reinterpret_cast<const volatile int64_t*>(d.rng_state)[0])),
        offset(static_cast<uint64_t>(reinterpret_cast<const volatile int64_t*>(d.rng_state)[1])),
        bh(static_cast<uint32_t>(batch) * static_cast<uint32_t>(heads_q) + static_cast<uint32_t>(head)),
        threshold(d.threshold),
        key_base(d.key_base) {}
#endif

  // Keys key_even and key_even + 1 of query `query` (key_even even): one Philox call, two elements.
  FLASHATTN_HOST_DEVICE void keep_key_pair(int query, int key_even, bool& keep0, bool& keep1) const {
    const uint32_t key = key_base + static_cast<uint32_t>(key_even);
    const PhiloxWords words = dropout_block_words(seed, offset, bh, static_cast<uint32_t>(query), key);
    keep0 = dropout_word(words, static_cast<uint32_t>(query), key) >= threshold;
    keep1 = dropout_word(words, static_cast<uint32_t>(query), key + 1) >= threshold;
  }
  // Queries query_even and query_even + 1 (query_even even) of key `key`: one call, two elements.
  FLASHATTN_HOST_DEVICE void keep_query_pair(int query_even, int key, bool& keep0, bool& keep1) const {
    const uint32_t k = key_base + static_cast<uint32_t>(key);
    const PhiloxWords words = dropout_block_words(seed, offset, bh, static_cast<uint32_t>(query_even), k);
    keep0 = dropout_word(words, static_cast<uint32_t>(query_even), k) >= threshold;
    keep1 = dropout_word(words, static_cast<uint32_t>(query_even) + 1, k) >= threshold;
  }
};

FLASHATTN_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t query, uint32_t key,
                                        uint32_t threshold) {
  return dropout_word(dropout_block_words(seed, offset, bh, query, key), query, key) >= threshold;
}

}  // namespace flashattn
