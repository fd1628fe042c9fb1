#include "sm80/fwd_kernel.cuh"
#include "variants.h"
using flashattn::sm80::FwdConfig;
void add_fwd_variants_128(std::vector<FwdVariant>& out) {
  FLASHATTN_FWD_VARIANT(128, FwdConfig<128, 4, 2, 64, false, 2>)
  FLASHATTN_FWD_VARIANT(128, FwdConfig<128, 4, 2, 32, false, 2>)
  FLASHATTN_FWD_VARIANT(128, FwdConfig<128, 8, 1, 64, true, 1>)
  FLASHATTN_FWD_VARIANT(128, FwdConfig<128, 8, 1, 64, false, 1>)
  FLASHATTN_FWD_VARIANT(128, FwdConfig<128, 4, 2, 32, true, 2>)
}
