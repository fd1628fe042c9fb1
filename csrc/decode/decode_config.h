// Tile shapes of the decode kernel (decode_kernel.cuh), shared by the kernel, its launch and the host's
// question of whether a GPU can run it (decode_supported).
#pragma once

namespace flashattn {
namespace decode {

// Query rows per thread block: one mma m-tile. A kv head's rows (its group's query heads times the
// queries per sequence) beyond 16 take more thread blocks, which read the same keys.
constexpr int kRows = 16;
// Keys per warp per step: one k-step of the PV product.
constexpr int kBlockKeys = 16;
// Warps per thread block; each walks its own key blocks (warp w takes blocks w, w + kWarps, ...) with a
// ring of its own, so the loop needs no block-wide barrier.
constexpr int kWarps = 4;

// The compiled head-dim widths; a head dim runs at the smallest width that holds it (zero-padded).
constexpr int kWidths[] = {64, 96, 128, 192, 256};

constexpr int width_for(int head_dim) {
  for (int w : kWidths) {
    if (head_dim <= w) return w;
  }
  return 0;
}

// Ring stages per warp: deep enough that each warp has two or three key blocks in flight, small enough
// that one thread block fits an A100's 163 KiB (the widest two give up depth for it). Measured: with
// one such block an SM, a warp alone on its scheduler issues too slowly to keep HBM busy (docs/perf-log.md,
// the decode op's first run); shallower rings, so that several blocks share an SM, are the open lead.
constexpr int stages_for(int width) { return width <= 128 ? 4 : (width <= 192 ? 3 : 2); }

// Elements between shared tile rows: 8 of padding spreads ldmatrix's eight row reads over the banks.
constexpr int stride_for(int width) { return width + 8; }

// The ring depths a width also has a form for (the planner's decode_stages option), besides stages_for's.
constexpr bool has_stages(int width, int stages) {
  return stages == stages_for(width) || (stages == 2 && width <= 192) || (stages == 3 && width <= 128);
}

// Dynamic shared memory of one thread block with `stages` ring stages a warp: the K/V rings and the Q
// tile, or (after the key loop) the warps' partial outputs for the merge, whichever is larger.
template <typename T>
constexpr int smem_bytes(int width, int stages) {
  const int tile = kBlockKeys * stride_for(width) * static_cast<int>(sizeof(T));
  const int rings = kWarps * stages * 2 * tile;
  const int q_tile = kRows * stride_for(width) * static_cast<int>(sizeof(T));
  const int merge = kWarps * kRows * (width + 2) * static_cast<int>(sizeof(float));
  return (rings + q_tile > merge) ? rings + q_tile : merge;
}

}  // namespace decode
}  // namespace flashattn
