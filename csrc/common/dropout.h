// The dropout keep-mask: which (query, key) probabilities survive dropout. Shared by the CPU and GPU
// paths, so that every kernel (forward and backward, any tiling) and the keep-mask op agree bit for bit.
//
// The mask is a pure function of (seed, offset, batch * heads_q + head, query, key). Elements come in
// octets: {q0, q0 + 8} x {k0, k0 + 8, k0 + 16, k0 + 24} with q0 % 16 < 8 and k0 % 32 < 8. One
// Philox4x32-7 call per octet gives four 32-bit words; word i holds key k0 + 8i, its low 16 bits for
// query q0 and its high 16 bits for q0 + 8, and the element is kept iff those 16 bits are at least
// `threshold` = floor(p * 2^16) (so the keep probability is 1 - threshold / 2^16, within 2^-16 of
// 1 - p). A kept probability is scaled by 1 / (1 - p).
//
// Why this shape: the tensor-core fragments of every kernel give one thread rows (or columns) 8 apart
// and, across its tiles, keys (or queries) 8 apart, so the forward threads (queries x keys, sm90 and
// sm80) and the sm80 backward's (keys x queries) each hold whole octets and use all eight values of
// every call. A thread of the sm90 backward holds two of an octet's four keys (sm90/bwd_dropout.h).
//
// Counter = ((k0 / 32) * 8 + k0 % 8, (q0 / 16) * 8 + q0 % 8, batch * heads_q + head, low 32 bits of
// offset); Philox key = the 64-bit seed. Seed and offset come from a [2] int64 tensor (rng_state)
// drawn from torch's generator, so a kernel reads them from device memory and CUDA-graph replays
// draw new ones.
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

// Philox4x32 with kRounds rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
template <int kRounds>
FLASHATTN_HOST_DEVICE PhiloxWords philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                            uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < kRounds; ++round) {
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
  uint32_t threshold = 0;              // keep iff the element's 16 random bits >= threshold
  float keep_scale = 1.f;              // 1 / (1 - p)
  const int64_t* rng_state = nullptr;  // [2] on the op's device: seed, offset
  uint32_t key_base = 0;               // index of the kernel's key 0 in the op's keys (key-range passes); a multiple of 32
};

// threshold for probability p in [0, 1): floor(p * 2^16), at most 2^16 - 1.
inline uint32_t dropout_threshold(double p) {
  const double scaled = p * 65536.0;
  return scaled >= 65535.0 ? 0xFFFFu : static_cast<uint32_t>(scaled);
}

// The keep-mask's rounds. Salmon et al. find Philox4x32 with 7 rounds free of statistical failures in
// TestU01's BigCrush (10 is their default, with a safety margin). Seven cost each score of the forward
// less of the RNG's work, which dominates dropout's cost (docs/perf-log.md).
constexpr int kDropoutPhiloxRounds = 7;

// The random words of the octet {query0, query0 + 8} x {key0 + 8i, i < 4} (query0 % 16 < 8, key0 % 32 < 8)
// of row group `bh` (batch * heads_q + head): word i holds key0 + 8i, its low half query0, its high half
// query0 + 8.
FLASHATTN_HOST_DEVICE PhiloxWords dropout_octet_words(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t query0,
                                                      uint32_t key0) {
  return philox4x32<kDropoutPhiloxRounds>(((key0 >> 5) << 3) | (key0 & 7), ((query0 >> 4) << 3) | (query0 & 7), bh,
                                          static_cast<uint32_t>(offset), static_cast<uint32_t>(seed),
                                          static_cast<uint32_t>(seed >> 32));
}

// Whether the low (high) half of word w survives: (w & 0xFFFF) >= threshold, i.e. (w << 16) >=
// threshold << 16 (w >> 16 >= threshold, i.e. w >= threshold << 16). The shifted forms cost a kernel
// one compare per element.
FLASHATTN_HOST_DEVICE bool dropout_keeps_low(uint32_t word, uint32_t threshold) {
  return (word << 16) >= (threshold << 16);
}
FLASHATTN_HOST_DEVICE bool dropout_keeps_high(uint32_t word, uint32_t threshold) { return word >= (threshold << 16); }

// The keep bits of the octet {query0, query0 + 8} x {key0 + 8i, i < 4} of row group bh: bit 2i + h is
// (query0 + 8h, key0 + 8i).
FLASHATTN_HOST_DEVICE uint32_t dropout_octet(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t query0,
                                             uint32_t key0, uint32_t threshold) {
  const PhiloxWords words = dropout_octet_words(seed, offset, bh, query0, key0);
  uint32_t bits = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 4; ++i) {
    bits |= static_cast<uint32_t>(dropout_keeps_low(words.w[i], threshold)) << (2 * i);
    bits |= static_cast<uint32_t>(dropout_keeps_high(words.w[i], threshold)) << (2 * i + 1);
  }
  return bits;
}

// Whether element (query, key) of row group bh is kept (one octet call per element: for tests and the
// keep-mask op; kernels use dropout_octet for whole octets).
FLASHATTN_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t query, uint32_t key,
                                        uint32_t threshold) {
  const uint32_t h = (query >> 3) & 1, i = (key >> 3) & 3;
  const uint32_t bits = dropout_octet(seed, offset, bh, query - 8 * h, key - 8 * i, threshold);
  return (bits >> (2 * i + h)) & 1;
}

// Row `query` of row group bh's keep-mask, written to row[0 .. seqlen_k) on the host: one octet call
// fills the row's four keys of that octet (the CPU's keep-mask ops).
inline void write_keep_mask_row(uint64_t seed, uint64_t offset, uint32_t bh, uint32_t query, int64_t seqlen_k,
                                uint32_t threshold, bool* row) {
  const uint32_t h = (query >> 3) & 1;  // which query of the octets this row is
  for (int64_t block = 0; block < seqlen_k; block += 32) {
    for (int64_t r = 0; r < 8 && block + r < seqlen_k; ++r) {
      const uint32_t bits = dropout_octet(seed, offset, bh, query - 8 * h, static_cast<uint32_t>(block + r), threshold);
      for (int64_t i = 0; i < 4 && block + r + 8 * i < seqlen_k; ++i) row[block + r + 8 * i] = (bits >> (2 * i + h)) & 1;
    }
  }
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

  // The octet {query0, query0 + 8} x {key0 + 8i}; key0 is relative to the kernel's keys.
  FLASHATTN_HOST_DEVICE uint32_t octet(int query0, int key0) const {
    return dropout_octet(seed, offset, bh, static_cast<uint32_t>(query0), key_base + static_cast<uint32_t>(key0),
                         threshold);
  }
  // Its random words (dropout_octet_words), for kernels that test the halves themselves.
  FLASHATTN_HOST_DEVICE PhiloxWords octet_words(int query0, int key0) const {
    return dropout_octet_words(seed, offset, bh, static_cast<uint32_t>(query0), key_base + static_cast<uint32_t>(key0));
  }
};

}  // namespace flashattn
