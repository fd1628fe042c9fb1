// The two layouts of the backward's fp32 dq workspace (BwdParams::dq_accum).
//   Rows (the sm80 backward): [B, Hq, Lq, width], a query's row contiguous.
//   Sm90 tiles (the sm90 backward): [B, Hq, stats_stride / 64, 64 * width], each 64-query block in the
//   order the sm90 consumers hold their dQ accumulators: the n8 block of head dims [8 J, 8 J + 8),
//   then the thread t (0..127) of the consumer holding it, then that thread's four elements of the
//   block (rows r and r + 8, two columns each). A warp then stages its dQ partial with 512-byte
//   contiguous stores (a row-major staging tile puts a row's 4 lanes and the 8 rows of an instruction
//   on the same 8 banks), and the block is added to the workspace with one bulk reduction as before.
#pragma once

#include <cstdint>

#include "common/mask.h"  // FLASHATTN_HOST_DEVICE

namespace flashattn {

constexpr int kDqTileRows = 64;

// Float offset, within its 64-query block, of the four elements a consumer's thread (0..127) holds of
// the n8 block of head dims [8 block, 8 block + 8), in the order (r, c), (r, c + 1), (r + 8, c),
// (r + 8, c + 1): r = 16 (thread / 32) + (thread % 32) / 4, and c = 8 block + 2 (thread % 4).
FLASHATTN_HOST_DEVICE int dq_tile_fragment_offset(int block, int thread) { return (block * 128 + thread) * 4; }

}  // namespace flashattn
