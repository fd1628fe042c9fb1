#include "sm80/bwd_kernel.cuh"
#include "variants.h"
using flashattn::sm80::BwdConfig;
void add_bwd_variants_128(std::vector<BwdVariant>& out) {
  FLASHATTN_BWD_VARIANT(128, BwdConfig<128, 64, 128, 8, 4, 4, 2>)
  FLASHATTN_BWD_VARIANT(128, BwdConfig<128, 64, 128, 8, 4, 4, 4>)
  FLASHATTN_BWD_VARIANT(128, BwdConfig<128, 64, 128, 8, 2, 4, 2>)
  FLASHATTN_BWD_VARIANT(128, BwdConfig<128, 32, 128, 8, 8, 4, 2>)
  FLASHATTN_BWD_VARIANT(128, BwdConfig<128, 64, 64, 4, 2, 2, 2>)
  FLASHATTN_BWD_VARIANT(128, BwdConfig<128, 64, 128, 8, 4, 2, 2>)
}
