// See plan.h. Host code (a .cu file for the kernel configurations' headers it reads).
#include "plan.h"

#include <cstdlib>

#include "sm80/api.h"
#include "sm90/api.h"

namespace flashattn {
namespace {

// Environment switch `name`: "1..." on, "0..." off; unset or anything else, `fallback`.
bool env_bool(const char* name, bool fallback) {
  const char* env = std::getenv(name);
  return env != nullptr && (env[0] == '0' || env[0] == '1') ? env[0] == '1' : fallback;
}

Choice env_choice(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr || (env[0] != '0' && env[0] != '1')) return Choice::kAuto;
  return env[0] == '1' ? Choice::kOn : Choice::kOff;
}

PlanOptions options_from_environment() {
  PlanOptions o;
  o.force_sm80 = env_bool("FLASHATTN_FORCE_SM80", false);
  o.sm90_multicast = env_choice("FLASHATTN_SM90_MULTICAST");
  o.sm90_wide_key_blocks = env_choice("FLASHATTN_SM90_WIDE_KEY_BLOCKS");
  o.sm90_narrow_tail = env_bool("FLASHATTN_SM90_NARROW_TAIL", true);
  o.sm90_dynamic_tail = !env_bool("FLASHATTN_SM90_STATIC_SCHEDULE", false);
  o.sm90_staged_output = !env_bool("FLASHATTN_SM90_DIRECT_OUTPUT", false);
  o.sm90_bwd_wide_steps = env_bool("FLASHATTN_SM90_BWD_WIDE_STEPS", true);
  const char* stages = std::getenv("FLASHATTN_DECODE_STAGES");
  o.decode_stages = stages != nullptr && (stages[0] == '2' || stages[0] == '3') && stages[1] == '\0' ? stages[0] - '0' : 0;
  return o;
}

PlanOptions& options_storage() {
  static PlanOptions options = options_from_environment();
  return options;
}

// What the GPU offers a block, capped by the smem_per_block_cap option (0: not known).
int smem_limit(const DeviceInfo& device, const PlanOptions& options) {
  const int cap = options.smem_per_block_cap;
  if (cap <= 0) return device.smem_per_block;
  return device.smem_per_block > 0 && device.smem_per_block < cap ? device.smem_per_block : cap;
}

bool sm90_device(const DeviceInfo& device, const PlanOptions& options) {
  return !options.force_sm80 && device.major == 9 && device.minor == 0 && sm90::compiled();
}

// Whether classifying a mask's tiles can pay: always for a boolean mask (1 byte per element); for a
// floating one only when it is broadcast over batch or heads (a dense one would be read twice).
bool worth_classifying(const MaskLayout& m, const AttentionShape& s) {
  return m.is_bool || (s.batch > 1 && m.batch_stride_zero) || (s.heads_q > 1 && m.head_stride_zero);
}

// The key-length form a classified mask can take in the sm90 kernels: with rows broadcast over the
// queries (a padding mask), the rows that keep a prefix of the keys; with a row per query, the slices
// that are causal masks over a key prefix. Not with causal masking or dropout of the call's own.
KeyLengthForm key_length_form(const MaskLayout& m, const AttentionShape& s, bool classified, bool dropout) {
  if (!classified || s.is_causal || dropout) return KeyLengthForm::kNone;
  return m.row_stride_zero || s.seqlen_q == 1 ? KeyLengthForm::kPadding : KeyLengthForm::kCausal;
}

}  // namespace

const PlanOptions& plan_options() { return options_storage(); }
void set_plan_options(const PlanOptions& options) { options_storage() = options; }

FwdPlan plan_fwd(const FwdCall& call, const DeviceInfo& device, const PlanOptions& options) {
  const AttentionShape& s = call.shape;
  FwdPlan plan;
  const bool masked = call.mask.present || call.dropout;  // the variant with both
  if (!(sm90_device(device, options) && sm90::fwd_supported(s, call.qkv_tma))) {
    plan.path = GpuPath::kSm80;
    const int limit = smem_limit(device, options);
    plan.sm80_tiles = sm80::fwd_tiles(s.head_dim, masked, limit);
    plan.smem = {sm80::fwd_smem_bytes(s.head_dim, masked, plan.sm80_tiles), limit};
    if (call.mask.present) {
      plan.mask.tile = sm80::fwd_tile_shape(s.head_dim, plan.sm80_tiles);
      plan.mask.classify = worth_classifying(call.mask, s);
    }
    return plan;
  }
  plan.path = GpuPath::kSm90;
  const int width = sm90::fwd_tile_width(s.head_dim);
  if (call.mask.present) {
    plan.mask.tile = sm90::fwd_mask_tile(width);
    plan.mask.classify = worth_classifying(call.mask, s);
    plan.mask.key_form = key_length_form(call.mask, s, plan.mask.classify, call.dropout);
  }
  // The counter of the causal schedule's dynamic tail, for the only launches that may use it: causal
  // without a mask or dropout, and the causal key-length form's.
  plan.tile_counter = (s.is_causal && !masked) || plan.mask.key_form == KeyLengthForm::kCausal;
  if (!masked) {
    plan.sm90_launches = 1;
    plan.sm90[0] = sm90::plan_fwd_launch(s, width, sm90::FwdRows::kAll, call.out_tma, plan.tile_counter, device, options);
    return plan;
  }
  // The masked kernel (with the key-length form: only the rows it leaves), then the key-length form's
  // rows in the unmasked kernels (disjoint rows of out and lse), causal in the causal form.
  plan.sm90[plan.sm90_launches++] =
      sm90::plan_fwd_launch(s, width, sm90::FwdRows::kMasked, call.out_tma, plan.tile_counter, device, options);
  if (plan.mask.key_form != KeyLengthForm::kNone) {
    const AttentionShape key_rows = key_end_shape(s, plan.mask.key_form == KeyLengthForm::kCausal);
    plan.sm90[plan.sm90_launches++] = sm90::plan_fwd_launch(key_rows, width, sm90::FwdRows::kKeyEnds, call.out_tma,
                                                            plan.tile_counter, device, options);
  }
  return plan;
}

BwdPlan plan_bwd(const BwdCall& call, const DeviceInfo& device, const PlanOptions& options) {
  const AttentionShape& s = call.shape;
  BwdPlan plan;
  const bool masked = call.mask.present || call.dropout;
  // A mask or dropout needs the masked variant (in deterministic mode its form with the dq turns).
  const bool sm90 = sm90_device(device, options) && sm90::bwd_supported(s, call.tensors_tma) &&
                    (!masked || sm90::bwd_masked_supported(s.head_dim));
  plan.path = sm90 ? GpuPath::kSm90 : GpuPath::kSm80;
  plan.dq_accum_dim = sm90 ? sm90::bwd_tile_width(s.head_dim) : sm80::padded_head_dim(s.head_dim);
  if (sm90) {
    // 128-query steps where the kernel has them: the unmasked kernel at width 64, whose dK, dV, S^T
    // and dP^T then fit a consumer's registers (in deterministic mode a step takes the dq turns of
    // both its 64-query blocks).
    const bool wide_steps = options.sm90_bwd_wide_steps && !masked && sm90::bwd_tile_width(s.head_dim) == 64;
    plan.sm90_block_m = wide_steps ? 128 : 64;
  } else {
    const int limit = smem_limit(device, options);
    plan.sm80_tiles = sm80::bwd_tiles(s.head_dim, limit);
    plan.smem = {sm80::bwd_smem_bytes(s.head_dim, plan.sm80_tiles), limit};
  }
  if (!call.mask.present) return plan;
  plan.mask.tile = sm90 ? sm90::bwd_tile_shape() : sm80::bwd_tile_shape(s.head_dim, plan.sm80_tiles);
  // Deterministic mode needs every key block to take its dq turn at every query block: no skipping.
  plan.mask.classify = !call.deterministic && worth_classifying(call.mask, s);
  // The key-length form where every GQA group's query heads share their mask row (the mask is
  // broadcast over heads, or there are no groups) and no mask gradient is written.
  const bool heads_share_rows = call.mask.head_stride_zero || s.heads_q == 1 || s.heads_q == s.heads_kv;
  // Not in the wide kernel (tile width 256), which has no key-length launch.
  if (sm90 && !call.dmask && heads_share_rows && sm90::bwd_tile_width(s.head_dim) <= 128) {
    plan.mask.key_form = key_length_form(call.mask, s, plan.mask.classify, call.dropout);
  }
  return plan;
}

}  // namespace flashattn
