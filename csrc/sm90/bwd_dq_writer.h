// How the sm90 backward adds each step's staged dQ partial into the dq workspace (one asynchronous bulk
// reduction per step), and deterministic mode's turns at those reductions.
//
// In deterministic mode a writer warp, warp 1 of the producer warpgroup, issues the reductions and
// takes and passes the turns, so that no consumer thread waits on another CTA's turn or on a
// reduction's completion (a consumer thread that did held up both consumer warpgroups at their next
// meeting). Otherwise lane 0 of the consumers' reducer warp issues each reduction itself, right after
// the consumers meet: without turns to wait for, the hand-over to another warp only adds its latency.
//
// The writer's hand-over, per step, between the consumers' reducer warp (threads 128..159; in the narrow
// kernel's unmasked column-split forms each consumer's first warp, DqReducer::send_parts) and the writer warp,
// through two mbarriers (DqHandover); the writer walks the CTA's steps itself, as the consumers and the
// producer do, so nothing but the staged partial passes between them:
//   consumers: store the dQ partial in the staging tile, meet (the partial complete; or each consumer's
//     warpgroup, its part complete), then lane 0 of the reducer warp (of each) arrives on `full`;
//   writer: locates the step's workspace rows (and its turns), waits on `full`, [takes the turns], issues
//     the reduction, waits until it has read the staging tile, arrives on `free`, [waits for its
//     completion, passes the turns];
//   consumers: before they next write the staging tile, the reducer warp waits on `free`.
// Step k (from 0) completes phase k of `full` and its reading phase k of `free`: neither side runs more
// than one phase ahead of the other, so parity k % 2 names the phase. (No message in shared memory:
// compute-sanitizer's racecheck reports a message's write and read as a race across these mbarriers,
// and across named barriers with bar.arrive, although both order them.)
#pragma once

#include <cstdint>

#include "cuda/dq_accum_layout.h"
#include "cuda/gpu_scope.h"
#include "params.h"
#include "sm90/ptx.h"

namespace flashattn {
namespace sm90 {

// The hand-over's two mbarriers (one arrival per phase each).
struct DqHandover {
  uint64_t full;  // the staged partial ready
  uint64_t free;  // the staging tile read by the reduction
};

__device__ __forceinline__ DqHandover& dq_handover() {
  __shared__ DqHandover handover;
  return handover;
}

// Thread 0, before the CTA's first __syncthreads (and the mbarriers' init fence). senders: the arrivals
// that complete a phase of `full` (one per consumer when the consumers send their parts each on its
// own, DqReducer::send_parts).
__device__ __forceinline__ void init_dq_handover(int senders = 1) {
  mbar_init(&dq_handover().full, senders);
  mbar_init(&dq_handover().free, 1);
}

// Where the writer adds one step's partial, and deterministic mode's turns for it.
struct DqReduction {
  int64_t row;   // dq workspace row of the step's first query
  int* counter;  // the dq_keys_done counter of the step's first query block (null: no turns)
  int wait[2];   // the values counter[0] and counter[1] must reach before the reduction (-1: no turn there)
};

// Whether a backward kernel form sends its dQ reductions through the writer warp: in deterministic mode,
// in the forms that take the turns (the unmasked kernel and the masked one's kMaskedTurns form).
template <bool kMasked, bool kMaskedTurns>
__device__ __forceinline__ bool dq_to_writer(const BwdParams& p) {
  return (!kMasked || kMaskedTurns) && p.deterministic;
}

// Deterministic mode's order (BwdParams::deterministic): the key blocks add their dQ partials into a
// query block in a fixed order, through the dq_keys_done counters as in the sm80 backward. The blocks
// a key block waits for have lower blockIdx.x (bwd_key_block), so they were dispatched first and keep
// their SMs until they finish; the first block of the order never waits, so by induction every awaited
// turn is passed (wait_for_dq_turn in the sm80 backward makes the same argument). A turn is passed as
// soon as its reduction has completed.
// A step of kRows = 128 queries (the unmasked kernel at width 64) adds into two query blocks at once:
// it takes the turn of each block that has rows and whose queries see the key block, in increasing
// order, and passes both. A key block never waits for one after it in either block's order, so holding
// the first turn while waiting for the second cannot deadlock; the rows it adds without a turn (a block
// none of whose queries see its keys) are zeros.
template <int kBlockN, int kRows = kDqTileRows>
struct DqTurns {
  static constexpr int kBlocks = kRows / kDqTileRows;  // query blocks per step
  static_assert(kRows % kDqTileRows == 0 && kBlocks <= 2, "one or two query blocks a step");

  // The key blocks that see query block m0 / 64 are 0 .. n_last. Without causal masking they take
  // their turns in increasing order; under causal masking in decreasing order, n_last first: key block
  // n starts at the query block of its diagonal, where it is then the first (in increasing order, each
  // diagonal block would wait for every key block before it to walk down to its first query block).
  // Negative when none of the block's queries sees the key block (possible in a 128-query step only):
  // the block lies right of their diagonals or, under a sliding window, left of their windows (the key
  // blocks that take turns are then those from the first row's window start to the last row's
  // diagonal, still n_last first).
  __device__ __forceinline__ static int turn_at(const AttentionShape& sh, int m0, int n_block) {
    if (!sh.is_causal) return n_block;
    if (sh.window_span >= 0 && (n_block + 1) * kBlockN <= m0 + sh.causal_offset - sh.window_span) return -1;
    const int last_key = min(min(m0 + kDqTileRows, sh.seqlen_q) - 1 + sh.causal_offset, sh.seqlen_k - 1);
    return last_key / kBlockN - n_block;
  }
  // The counter of a batched call's query block from query m0 of (batch, head).
  __device__ __forceinline__ static int* counter(const BwdParams& p, int batch, int head, int m0) {
    const AttentionShape& sh = p.shape;
    const int blocks = (sh.seqlen_q + kDqTileRows - 1) / kDqTileRows;
    return p.dq_keys_done + (static_cast<int64_t>(batch) * sh.heads_q + head) * blocks + m0 / kDqTileRows;
  }
  // A variable-length batch's: one counter per 64 workspace rows, the query block's at workspace row
  // `row`.
  __device__ __forceinline__ static int* varlen_counter(const BwdParams& p, int64_t row) {
    return p.dq_keys_done + row / kDqTileRows;
  }
  // Fills the turns of key block n_block at the step from query m0 (`sh`: the step's shape, a
  // variable-length batch's sequence), counter that of its first query block.
  __device__ __forceinline__ static void ticket(DqReduction& m, int* counter, const AttentionShape& sh, int m0,
                                                int n_block) {
    m.counter = counter;
    const int turn = turn_at(sh, m0, n_block);
    m.wait[0] = kBlocks == 1 || turn >= 0 ? turn * kBlockN : -1;
    m.wait[1] = -1;
    if constexpr (kBlocks > 1) {
      const int second = turn_at(sh, m0 + kDqTileRows, n_block);
      if (m0 + kDqTileRows < sh.seqlen_q && second >= 0) m.wait[1] = second * kBlockN;  // has rows, sees the keys
    }
  }
};

// Run by the 32 lanes of the writer warp over the CTA's steps: next(head, m0) gives the next step's
// query head and first query, false past the last (the walk the consumers run). Adds each step's staged
// dQ partial at `stage` (kRows queries x kWidth head dims, fp32, the tile layout: whole blocks, rows past
// seqlen_q included, which hold zeros) into the dq workspace where locate(head, m0) says (a
// DqReduction); lane 0 issues.
template <int kWidth, int kRows, int kBlockN, typename Next, typename Locate>
__device__ __forceinline__ void write_dq(const BwdParams& p, const float* stage, Next&& next, Locate&& locate) {
  static_assert(kRows % kDqTileRows == 0, "whole blocks of the tile layout");
  DqHandover& handover = dq_handover();
  const bool leader = threadIdx.x % 32 == 0;
  int head = 0, m0 = 0;
  for (int k = 0; next(head, m0); ++k) {
    const DqReduction r = locate(head, m0);
    int* const counter = r.counter;
    const int wait0 = r.wait[0], wait1 = r.wait[1];
    mbar_wait(&handover.full, k & 1);
    if (leader) {
      if (counter != nullptr) {
        if (wait0 >= 0) {
          while (ld_acquire_gpu(counter) != wait0) {
          }
        }
        if (wait1 >= 0) {
          while (ld_acquire_gpu(counter + 1) != wait1) {
          }
        }
        fence_proxy_async_global();  // the earlier turns' reductions before this one's
      }
      bulk_reduce_add_f32(p.dq_accum + r.row * kWidth, stage, kRows * kWidth * 4);
      bulk_commit();
      bulk_wait_read();
      mbar_arrive(&handover.free);  // the staging tile may be rewritten
      if (counter != nullptr) {
        bulk_wait();  // the reduction has completed: pass the turns on
        fence_proxy_async_global();
        if (wait0 >= 0) red_add_release_gpu(counter, kBlockN);
        if (wait1 >= 0) red_add_release_gpu(counter + 1, kBlockN);
      }
    }
    __syncwarp();
  }
  if (leader) bulk_wait();
}

// The consumers' side, run by their reducer warp (threads 128..159, or each consumer's first warp: a
// whole warp) only. to_writer: the writer warp runs (deterministic mode's turns), else lane 0 issues
// the reductions.
struct DqReducer {
  bool to_writer;

  // Before the staging tile is written for step `iter` (steps run so far): the previous step's
  // reduction has read it.
  __device__ __forceinline__ void await_stage(int iter) const {
    if (to_writer) {
      if (iter > 0) mbar_wait(&dq_handover().free, (iter - 1) & 1);  // step iter - 1's partial read
    } else if (threadIdx.x % 32 == 0) {
      bulk_wait_read();
    }
  }
  // Once the consumers have met after staging the partial (kRows queries x kWidth head dims at `stage`)
  // of the step of query head `head` from query m0, whose dq workspace row row() gives: hands it to the
  // writer, or issues its reduction.
  template <int kWidth, int kRows, typename Row>
  __device__ __forceinline__ void send_stage(const BwdParams& p, const float* stage, int head, int m0, Row&& row) const {
    if (to_writer) {
      if (threadIdx.x % 32 == 0) mbar_arrive(&dq_handover().full);  // the partial, staged before the meeting
      __syncwarp();
    } else if (threadIdx.x % 32 == 0) {
      bulk_reduce_add_f32(p.dq_accum + row() * kWidth, stage, kRows * kWidth * 4);
      bulk_commit();
    }
  }
  // The narrow kernel's form of send_stage, with no meeting of the consumers: each consumer's reducer
  // warp sends its own parts of the partial once its warpgroup has staged them, kParts float ranges
  // [offset, offset + count) of the kRows x kWidth block at `stage`, which go to the same ranges of the
  // workspace block from row row(). Lane 0 issues their reductions, or arrives on `full` (initialised
  // for one arrival per consumer: the writer then adds the whole block, every consumer's parts staged).
  // Each consumer's reducer warp calls await_stage and finish too.
  template <int kWidth, int kParts, typename Row>
  __device__ __forceinline__ void send_parts(const BwdParams& p, const float* stage, const int (&offset)[kParts],
                                             const int (&count)[kParts], Row&& row) const {
    if (threadIdx.x % 32 == 0) {
      if (to_writer) {
        mbar_arrive(&dq_handover().full);
      } else {
        float* const block = p.dq_accum + row() * kWidth;
#pragma unroll
        for (int i = 0; i < kParts; ++i) bulk_reduce_add_f32(block + offset[i], stage + offset[i], count[i] * 4);
        bulk_commit();
      }
    }
    __syncwarp();
  }
  // After the consumers' last step (iter: the steps they ran): waits until the writer's last reduction
  // has read the staging tile, or for the last reduction.
  __device__ __forceinline__ void finish(int iter) const {
    if (to_writer) {
      await_stage(iter);
    } else if (threadIdx.x % 32 == 0) {
      bulk_wait();
    }
  }
};

}  // namespace sm90
}  // namespace flashattn
