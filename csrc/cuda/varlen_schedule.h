// The work lists of a variable-length batch (params.h, VarlenParams::tiles), built on the device from
// the sequence offsets so that the host never reads them. Host-callable, free of torch headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "params.h"

namespace flashattn {

// What one list enumerates: item (b, block, head) for every sequence b, every block of block_rows
// rows of its queries (kForward: a forward tile, with `heads` query heads) or of its keys (kBackward:
// a backward CTA, with `heads` kv heads), every head.
enum class VarlenWork : int { kForward = 0, kBackward = 1 };

struct VarlenListSpec {
  VarlenWork work = VarlenWork::kForward;
  int batch = 0;
  int heads = 0;
  int block_rows = 0;  // rows of an item's block (queries forward, keys backward)
  int cost_rows = 0;   // rows of the other side counted per unit of cost (keys forward, queries backward)
  bool is_causal = false;
  // Heaviest first, in sections that share the other side's rows in the L2 (varlen_schedule.cu): the
  // order a greedy schedule balances best without reading every head's rows at once. false: sequence
  // by sequence, head by head, the blocks in the order the backward's deterministic turns need
  // (decreasing under causal masking, as BwdKeyBlock numbers them).
  bool by_cost = true;
  // The bytes one row of the other side (keys forward, queries backward) has a CTA read, for
  // head_group consecutive heads of the list together (GQA: the query heads of one kv head read the
  // same keys): what sizes the sections.
  int64_t other_row_bytes = 0;
  int head_group = 1;
};

// An item of a list: x = b, y = block * heads + head.
inline int64_t varlen_list_capacity(const VarlenListSpec& spec, int64_t total_rows) {
  return static_cast<int64_t>(spec.heads) * ((total_rows + spec.block_rows - 1) / spec.block_rows + spec.batch);
}

// A capacity enough for any list of a call whose blocks are 64 rows or more: what the host allocates.
inline int64_t varlen_list_capacity_bound(int heads, int batch, int64_t total_rows) {
  return static_cast<int64_t>(heads) * ((total_rows + 63) / 64 + batch);
}

// Writes the list for `varlen`'s offsets into items [capacity] and its length into *count, on the
// stream. total_rows: the packed rows of the enumerated side (total_q forward, total_k backward).
cudaError_t build_varlen_list(const VarlenParams& varlen, const VarlenListSpec& spec, int2* items, int* count,
                              cudaStream_t stream);

}  // namespace flashattn
