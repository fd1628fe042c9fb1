#include "sm80/bwd_kernel.cuh"
#include "variants.h"
using flashattn::sm80::BwdConfig;
// Head dim 256 (only the sm80 backward runs it): the default first, then other splits of the eight
// warps for the dK/dV and dQ GEMMs (the S^T split is fixed: the kernel's dropout needs 32-key warp tiles).
void add_bwd_variants_256(std::vector<BwdVariant>& out) {
  FLASHATTN_BWD_VARIANT(256, BwdConfig<256, 64, 64, 8, 2, 2, 4>)
  FLASHATTN_BWD_VARIANT(256, BwdConfig<256, 64, 64, 8, 2, 2, 2>)
  FLASHATTN_BWD_VARIANT(256, BwdConfig<256, 64, 64, 8, 2, 4, 2>)
  FLASHATTN_BWD_VARIANT(256, BwdConfig<256, 64, 64, 8, 2, 4, 4>)
  FLASHATTN_BWD_VARIANT(256, BwdConfig<256, 64, 64, 8, 2, 1, 4>)
}
