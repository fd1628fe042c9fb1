// Which tiles each persistent CTA of the sm90 forward runs, and in what order.
//
// A tile is a block of kBlockM queries of one query head of one batch entry. Tiles are numbered with
// the query block fastest, the last query block first, so under causal masking the longest rows come
// first and the short ones fill the tail.
//
// Units: with tiles_per_unit = 2 the query blocks of each (query head, batch) row are paired, block j
// with block num_m - 1 - j (the middle block alone when num_m is odd). Under causal masking, or a
// causal-shaped mask, every pair then costs the same, so CTA c can simply run pairs c, c + gridDim.x,
// ... (heavier block first) and no CTA is left with much more work than another, while each CTA's next
// tile loads during its current tile's epilogue. Consecutive pairs share a head, so the CTAs running at
// once read the same K and V (L2 hits). With 1, a unit is one tile (when the tiles fit in one wave,
// pairing would only halve the CTAs; without causal masking or a mask every tile costs the same).
//
// The dynamic tail: the static pairs still leave the busiest CTA about one pair above the mean. So, with dynamic_heads = S > 0, only the pairs of all but
// the last S (head, batch) rows are dealt out statically; the last S rows' tiles are then taken one by
// one, heaviest first (all S rows' last query blocks, then their second to last, ...), each by the first
// CTA whose producer asks (an atomicAdd on FwdParams::tile_counter, zeroed before the launch). The
// producer names every tile, static or not, to its consumers through shared memory (FwdBarriers), and
// -1 when no tile is left. scripts/dev/schedule_sim.py has the arithmetic behind S (fwd_dynamic_heads).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/mask.h"
#include "cuda/varlen.h"
#include "params.h"
#include "sm90/fast_divider.h"

namespace flashattn {
namespace sm90 {

// S for a launch of `grid` CTAs over pairs: enough dynamic tiles for about four per CTA (the last
// waves are what the pairs leave uneven), but no more rows than keep their K and V within about half
// of the L2 (24 MiB; the heaviest-first order reads all S rows' keys at once, where the pairs read one
// or two rows' at a time). 0 (no dynamic tail) when that cap leaves fewer than two tiles per CTA, too
// few to even anything out: at head dim 256 it always does, and there the tail measured no gain
// (docs/perf-log.md).
inline int fwd_dynamic_heads(const AttentionShape& sh, int num_m, int grid) {
  if (num_m < 1) return 0;
  const int rows = sh.heads_q * sh.batch;
  const int for_balance = (4 * grid + num_m - 1) / num_m;
  // Query heads that share a key/value head (GQA) share its bytes.
  const int group = sh.heads_kv > 0 ? std::max(sh.heads_q / sh.heads_kv, 1) : 1;
  const int64_t kv_row_bytes = std::max<int64_t>(int64_t{4} * sh.seqlen_k * sh.head_dim, 1);  // K and V, 2 bytes each
  const int64_t for_l2 = std::max<int64_t>(1, (int64_t{24} << 20) / kv_row_bytes) * group;
  const int64_t s = std::min<int64_t>({static_cast<int64_t>(rows), for_balance, for_l2});
  return s * num_m >= 2 * static_cast<int64_t>(grid) ? static_cast<int>(s) : 0;
}

// Built on the host and passed to the kernel by value, so that its fields and dividers are read from
// the kernel's parameter space rather than held in registers (the producer has 24).
struct FwdSchedule {
  int num_m, units_per_head, tiles_per_unit;
  int static_units;        // units dealt out statically: those of the first rows - dynamic_heads rows
  int dynamic_tiles;       // tiles of the last dynamic_heads rows (0: no dynamic tail)
  int first_dynamic_tile;  // the tile index of the first of those rows' first tile
  FastDivider by_num_m, by_units_per_head, by_heads_q, by_group, by_dynamic_heads;

  // tiles_per_unit 1 or 2; dynamic_heads S (0: none) only with 2.
  FwdSchedule(const AttentionShape& sh, int block_m, int tiles_per_unit_, int dynamic_heads)
      : num_m((sh.seqlen_q + block_m - 1) / block_m),
        units_per_head(tiles_per_unit_ == 2 ? (num_m + 1) / 2 : num_m),
        tiles_per_unit(tiles_per_unit_),
        static_units(units_per_head * (sh.heads_q * sh.batch - dynamic_heads)),
        dynamic_tiles(num_m * dynamic_heads),
        first_dynamic_tile(num_m * (sh.heads_q * sh.batch - dynamic_heads)),
        by_num_m(std::max(num_m, 1)),
        by_units_per_head(std::max(units_per_head, 1)),
        by_heads_q(std::max(sh.heads_q, 1)),
        by_group(std::max(sh.heads_q / std::max(sh.heads_kv, 1), 1)),
        by_dynamic_heads(std::max(dynamic_heads, 1)) {}

  // Tiles in unit `unit` (1 or 2), and the tile index of its tile `i`.
  __device__ __forceinline__ int tiles_in(int unit) const {
    return tiles_per_unit == 2 && 2 * by_units_per_head.mod(unit) + 1 != num_m ? 2 : 1;
  }
  __device__ __forceinline__ int tile(int unit, int i) const {
    if (tiles_per_unit == 1) return unit;
    const int whole = by_units_per_head.div(unit), j = unit - whole * units_per_head;
    const int m_block = i == 0 ? num_m - 1 - j : j;
    return whole * num_m + (num_m - 1 - m_block);
  }
  // The tile index of dynamic claim d (< dynamic_tiles): level d / S of row d % S of the tail, level 0
  // being each row's last (heaviest) query block.
  __device__ __forceinline__ int dynamic_tile(int d) const {
    const int level = by_dynamic_heads.div(d);
    const int row = d - level * static_cast<int>(by_dynamic_heads.divisor);
    return first_dynamic_tile + row * num_m + level;
  }
};

// One work tile.
struct FwdTile {
  int m0, head, kv_head, batch;
  int num_n_blocks;  // one past the last key block the tile's queries can see (0: none)
  int first_n_block;  // the first one (0 but under a sliding window; >= num_n_blocks: none)

  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ static FwdTile at(int tile, const AttentionShape& sh, const FwdSchedule& sched) {
    const int head_batch = sched.by_num_m.div(tile);  // head + heads_q * batch
    FwdTile t;
    t.m0 = (sched.num_m - 1 - (tile - head_batch * sched.num_m)) * kBlockM;
    t.batch = sched.by_heads_q.div(head_batch);
    t.head = head_batch - t.batch * sh.heads_q;
    t.kv_head = sched.by_group.div(t.head);
    const int key_end = visible_key_end(min(t.m0 + kBlockM, sh.seqlen_q), sh.seqlen_k, sh.is_causal, sh.causal_offset);
    t.num_n_blocks = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
    t.first_n_block = visible_key_begin(t.m0, sh.causal_offset, sh.window_span) / kBlockN;
    return t;
  }
  // Item `item` of a variable-length batch's list (cuda/varlen_schedule.h: x the sequence, y its query
  // block * heads_q + head), in sequence s: m0 counts from the sequence's first query.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ static FwdTile of_item(int2 item, const AttentionShape& sh, const FwdSchedule& sched,
                                                    const SeqSpan& s) {
    FwdTile t;
    const int m_block = sched.by_heads_q.div(item.y);
    t.head = item.y - m_block * sh.heads_q;
    t.m0 = m_block * kBlockM;
    t.batch = item.x;
    t.kv_head = sched.by_group.div(t.head);
    const int key_end = visible_key_end(min(t.m0 + kBlockM, s.len_q), s.len_k, sh.is_causal, s.causal_offset);
    t.num_n_blocks = key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0;
    t.first_n_block = visible_key_begin(t.m0, s.causal_offset, sh.window_span) / kBlockN;
    return t;
  }
  // Leaves out the blocks from key `key_end` on (a row of FwdParams::key_end; < 0: all of them).
  template <int kBlockN>
  __device__ __forceinline__ void limit_keys(int key_end) {
    num_n_blocks = min(num_n_blocks, key_end > 0 ? (key_end + kBlockN - 1) / kBlockN : 0);
  }
};

}  // namespace sm90
}  // namespace flashattn
