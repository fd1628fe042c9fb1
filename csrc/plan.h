// The planner: for one attention call on a GPU, which kernel path and variant runs, on what grid, and
// what the attention mask's prepasses compute. Every such decision is made here (and, for the sm90
// forward's variants, in sm90/fwd_plan.cu, which this calls), from the call's shape, its tensors'
// layout and the device alone, before anything is allocated or launched: the torch layer
// (csrc/torch/cuda_fwd.cpp, cuda_bwd.cpp) carries a plan out, and flashattn._C.plan_fwd / plan_bwd
// show it to tests on machines without a GPU. Host code only, free of torch headers.
#pragma once

#include <cstdint>

#include "cuda/api.h"  // TileShape
#include "params.h"
#include "sm90/fwd_plan.h"

namespace flashattn {

// A switch that can also be left to the planner.
enum class Choice : int8_t { kAuto = -1, kOff = 0, kOn = 1 };

// The planner's switches: each replaces one of its decisions, for tests (which compare kernel variants
// bit for bit) and for measurements (A/B runs, the sm80 path on a Hopper GPU). plan_options() reads
// them from the environment once, when first asked; set_plan_options changes them for the process
// (flashattn.plan.options(...) in Python). Not synchronised: set them while no other thread launches.
struct PlanOptions {
  bool force_sm80 = false;                      // FLASHATTN_FORCE_SM80=1: the sm80 kernels on every GPU
  Choice sm90_multicast = Choice::kAuto;        // FLASHATTN_SM90_MULTICAST: K/V multicast where it fits
  Choice sm90_wide_key_blocks = Choice::kAuto;  // FLASHATTN_SM90_WIDE_KEY_BLOCKS: 176-key blocks at width 128
  bool sm90_narrow_tail = true;                 // FLASHATTN_SM90_NARROW_TAIL=0: full-width last key blocks
  bool sm90_dynamic_tail = true;                // FLASHATTN_SM90_STATIC_SCHEDULE=1: static pairs only
  bool sm90_staged_output = true;               // FLASHATTN_SM90_DIRECT_OUTPUT=1: threads store O (initcheck)
  bool sm90_bwd_wide_steps = true;              // FLASHATTN_SM90_BWD_WIDE_STEPS=0: 64-query backward steps only
  // FLASHATTN_DECODE_STAGES=2|3: the decode kernel's ring stages per warp where its width has such a form
  // (0: decode_config.h's stages_for); shallower rings let several thread blocks share an SM.
  int decode_stages = 0;
  // Tests: plan as if the GPU offered at most this many bytes of shared memory per block (0: its own).
  int smem_per_block_cap = 0;
};
const PlanOptions& plan_options();
void set_plan_options(const PlanOptions& options);

// What the planner needs to know of the GPU (see cuda_device_info in csrc/torch/cuda_ops.h).
struct DeviceInfo {
  int major = 0, minor = 0;  // compute capability
  int num_sms = 0;
  int pair_clusters = 0;     // clusters of two full-size sm90 CTAs that can be resident at once (0: none)
  int smem_per_block = 0;    // opt-in shared memory per block, bytes (0: not known, not checked)
};

// The shared memory an sm80 kernel of a plan needs and what the GPU offers it. The planner picks the
// fastest sm80 tile configuration that fits (sm80_tiles); at head dims 192 and 256 the backward has
// none that fits a consumer GPU's 99 KiB a block.
struct SmemFit {
  int bytes = 0;  // the chosen sm80 kernel's (0: the sm90 path, whose kernels fit sm_90 by construction)
  int limit = 0;  // the GPU's, or the smem_per_block_cap option's (0: not known)
  bool fits() const { return limit == 0 || bytes <= limit; }
};

enum class GpuPath : int { kSm80 = 0, kSm90 = 1 };

// The key-length form of an attention mask (FwdParams::key_end): its (batch, head) rows that keep a
// prefix of the keys (a padding mask) or, for a mask with a row per query, its slices that are causal
// masks over a key prefix, found on the GPU and run by the unmasked kernels.
enum class KeyLengthForm : int { kNone = 0, kPadding = 1, kCausal = 2 };

// The layout of an attention mask ([B, Hq, Lq, Lk] view), as far as the planner reads it.
struct MaskLayout {
  bool present = false;
  bool is_bool = false;
  bool batch_stride_zero = false;  // stride(0) == 0
  bool head_stride_zero = false;   // stride(1) == 0
  bool row_stride_zero = false;    // stride(2) == 0: rows broadcast over the queries
};

// What the mask's prepasses compute before the kernels run (csrc/torch/mask_plan.cpp carries it out).
struct MaskPolicy {
  TileShape tile{0, 0};  // the grid of the kernel that reads the tile classes
  bool classify = false;  // compute the tile classes
  KeyLengthForm key_form = KeyLengthForm::kNone;
};

struct FwdCall {
  AttentionShape shape;
  MaskLayout mask;
  bool dropout = false;
  bool qkv_tma = false;  // q, k and v are TMA-describable (sm90::tma_describable)
  bool out_tma = false;  // and out
};

struct FwdPlan {
  GpuPath path = GpuPath::kSm80;
  MaskPolicy mask;
  bool tile_counter = false;  // the launches need FwdParams::tile_counter
  // The sm90 launches, in order: the one kernel, or the masked kernel's rows then the key-length form's.
  int sm90_launches = 0;
  sm90::FwdLaunchPlan sm90[2];
  int sm80_tiles = 0;  // the sm80 path's tile configuration (FwdParams::sm80_tiles)
  SmemFit smem;
};
FwdPlan plan_fwd(const FwdCall& call, const DeviceInfo& device, const PlanOptions& options);

struct BwdCall {
  AttentionShape shape;
  MaskLayout mask;
  bool dropout = false;
  bool deterministic = false;
  bool dmask = false;        // the mask's gradient is written
  bool tensors_tma = false;  // q, k, v and the dout the kernels read are TMA-describable
};

struct BwdPlan {
  GpuPath path = GpuPath::kSm80;
  MaskPolicy mask;
  int dq_accum_dim = 0;  // the dq workspace's row width: the chosen path's tile width
  // The workspace in the sm90 tile layout (cuda/dq_accum_layout.h): the sm90 backward's.
  bool dq_accum_tiled() const { return path == GpuPath::kSm90; }
  int sm80_tiles = 0;  // the sm80 path's tile configuration (BwdParams::sm80_tiles)
  int sm90_block_m = 0;  // the sm90 backward's queries per step (BwdParams::sm90_block_m; 0: the sm80 path)
  SmemFit smem;
};
BwdPlan plan_bwd(const BwdCall& call, const DeviceInfo& device, const PlanOptions& options);

}  // namespace flashattn
