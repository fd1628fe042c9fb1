// Hopper backward configurations (needs TUNE_ARCH=90a, tune.py's default).
#include "sm90/bwd_kernel.cuh"
#include "variants.h"
using flashattn::sm90::BwdConfig;
void add_bwd_variants_sm90(std::vector<BwdVariant>& out) {
  FLASHATTN_SM90_BWD_VARIANT(64, BwdConfig<64>)
  FLASHATTN_SM90_BWD_VARIANT(128, BwdConfig<128>)
}
