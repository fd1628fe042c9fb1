// How the sm90 backward adds each step's staged dQ partial into the dq workspace (one asynchronous bulk
// reduction per step), and deterministic mode's turns at those reductions.
//
// In deterministic mode a writer warp, warp 1 of the producer warpgroup, issues the reductions and
// takes and passes the turns, so that no consumer thread waits on another CTA's turn or on a
// reduction's completion (a consumer thread that did held up both consumer warpgroups at their next
// meeting). Otherwise lane 0 of the consumers' reducer warp issues each reduction itself, right after
// the consumers meet: without turns to wait for, the hand-over to another warp only adds its latency.
//
// The writer's hand-over, per step, between the consumers' reducer warp (threads 128..159) and the writer warp,
// through two named barriers of 64 threads (those two warps) and a message in shared memory:
//   consumers: store the dQ partial in the staging tile, meet (the partial complete), then the reducer
//     warp writes the step's message (its query head and first query) and arrives at kBwdDqFullBarrier;
//   writer: waits there, reads the message, locates the step's workspace rows (and its turns), [takes
//     the turns], issues the reduction, waits until it has read the staging tile, arrives at
//     kBwdDqFreeBarrier, [waits for its completion, passes the turns];
//   consumers: before they next write the staging tile, the reducer warp waits at kBwdDqFreeBarrier.
// After their last step the consumers wait for that step's stage release too, then send a message with
// m0 -1, which ends the writer's loop: every arrival is matched, none is left at the CTA's exit.
#pragma once

#include <cstdint>

#include "cuda/dq_accum_layout.h"
#include "cuda/gpu_scope.h"
#include "params.h"
#include "sm90/ptx.h"

namespace flashattn {
namespace sm90 {

// Named barriers of the hand-over (kBwdConsumerBarrier and the stage barriers sit below them).
constexpr int kBwdDqFullBarrier = 14;
constexpr int kBwdDqFreeBarrier = 15;
constexpr int kBwdDqHandoverThreads = 64;  // the consumers' reducer warp and the writer warp

// One step, written by the reducer warp's lane 0, read by the writer warp: only what the consumers hold
// anyway, so that the hand-over costs their registers nothing.
struct DqMessage {
  int head;  // the step's query head
  int m0;    // its first query (-1: no more steps)
};

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

__device__ __forceinline__ DqMessage& dq_message() {
  __shared__ DqMessage message;
  return message;
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

// Run by the 32 lanes of the writer warp until the consumers' last message: adds the staged dQ partial
// at `stage` (kRows queries x kWidth head dims, fp32, the tile layout: whole blocks, rows past seqlen_q
// included, which hold zeros) into the dq workspace where locate(head, m0) says (a DqReduction); lane 0
// issues.
template <int kWidth, int kRows, int kBlockN, typename Locate>
__device__ __forceinline__ void write_dq(const BwdParams& p, const float* stage, Locate&& locate) {
  static_assert(kRows % kDqTileRows == 0, "whole blocks of the tile layout");
  const DqMessage& message = dq_message();
  const bool leader = threadIdx.x % 32 == 0;
  for (;;) {
    named_barrier_sync(kBwdDqFullBarrier, kBwdDqHandoverThreads);
    const int head = message.head, m0 = message.m0;
    if (m0 < 0) break;
    const DqReduction r = locate(head, m0);
    int* const counter = r.counter;
    const int wait0 = r.wait[0], wait1 = r.wait[1];
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
    }
    __syncwarp();
    named_barrier_arrive(kBwdDqFreeBarrier, kBwdDqHandoverThreads);  // the staging tile may be rewritten
    if (leader && counter != nullptr) {
      bulk_wait();  // the reduction has completed: pass the turns on
      fence_proxy_async_global();
      if (wait0 >= 0) red_add_release_gpu(counter, kBlockN);
      if (wait1 >= 0) red_add_release_gpu(counter + 1, kBlockN);
    }
  }
  if (leader) bulk_wait();
}

// The consumers' side, run by their reducer warp (threads 128..159, a whole warp) only. to_writer: the
// writer warp runs (deterministic mode's turns), else lane 0 issues the reductions.
struct DqReducer {
  bool to_writer;

  // Before the staging tile is written for step `iter` (steps run so far): the previous step's
  // reduction has read it.
  __device__ __forceinline__ void await_stage(int iter) const {
    if (to_writer) {
      if (iter > 0) named_barrier_sync(kBwdDqFreeBarrier, kBwdDqHandoverThreads);
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
      send(head, m0);
    } else if (threadIdx.x % 32 == 0) {
      bulk_reduce_add_f32(p.dq_accum + row() * kWidth, stage, kRows * kWidth * 4);
      bulk_commit();
    }
  }
  // After the consumers' last step (iter: the steps they ran): ends the writer's loop, or waits for
  // the last reduction.
  __device__ __forceinline__ void finish(int iter) const {
    if (to_writer) {
      await_stage(iter);
      send(0, -1);
    } else if (threadIdx.x % 32 == 0) {
      bulk_wait();
    }
  }

 private:
  __device__ __forceinline__ static void send(int head, int m0) {
    if (threadIdx.x % 32 == 0) dq_message() = DqMessage{head, m0};
    __syncwarp();
    named_barrier_arrive(kBwdDqFullBarrier, kBwdDqHandoverThreads);
  }
};

}  // namespace sm90
}  // namespace flashattn
