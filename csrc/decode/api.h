// The decode path's entry points (decode_launch.cu): whether a call can run on it, how many key splits
// it takes, and the launch. Host code; no torch types.
#pragma once

#include <cuda_runtime.h>

#include "params.h"

namespace flashattn {
namespace decode {

// Whether the decode kernel serves head_dim (a multiple of 8, at most 256) on a GPU that offers
// smem_per_block bytes of shared memory to a block (0: not known, not checked).
bool supported(int head_dim, ElementType type, int smem_per_block);

// Query rows of one kv head (group query heads times seqlen_q) per thread block.
int rows_per_block();

// The split count for a call (num_splits = 0 in the API) on the current device: as many splits as fill
// the GPU's thread-block slots in one wave without passing it (a second, partial wave would cost as much
// as the first), and no split shorter than a few key blocks a warp. Sizes only, never the lengths on
// the device, so the choice needs no synchronisation and a CUDA graph replays it with any lengths.
int choose_splits(int batch, int heads_kv, int row_groups, int max_keys, int head_dim, ElementType type,
                  int num_sms);

// Runs the decode kernel (and the combine kernel when p.num_splits > 1) on stream.
cudaError_t launch(const DecodeParams& p, cudaStream_t stream);

}  // namespace decode
}  // namespace flashattn
