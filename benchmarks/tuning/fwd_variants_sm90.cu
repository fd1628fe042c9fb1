// The Hopper forward draft beside the sm80 configurations (needs TUNE_ARCH=90a, tune.py's default).
#include "sm90_fwd_draft.cuh"
#include "variants.h"

void add_fwd_variants_sm90(std::vector<FwdVariant>& out) {
  out.push_back({128, "sm90 draft: TMA + wgmma, 2 consumer warpgroups, 128x128 tiles",
                 &flashattn::sm90_draft::launch_fwd<__nv_bfloat16>});
}
