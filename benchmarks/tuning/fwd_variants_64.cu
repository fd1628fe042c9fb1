#include "sm80/fwd_kernel.cuh"
#include "variants.h"
using flashattn::sm80::FwdConfig;
void add_fwd_variants_64(std::vector<FwdVariant>& out) {
  FLASHATTN_FWD_VARIANT(64, FwdConfig<64, 4, 2, 64, true, 2>)
  FLASHATTN_FWD_VARIANT(64, FwdConfig<64, 8, 1, 64, true, 2>)
  FLASHATTN_FWD_VARIANT(64, FwdConfig<64, 4, 2, 64, false, 2>)
  FLASHATTN_FWD_VARIANT(64, FwdConfig<64, 8, 1, 128, true, 1>)
  FLASHATTN_FWD_VARIANT(64, FwdConfig<64, 4, 2, 32, true, 3>)
}
