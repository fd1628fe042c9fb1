// Hopper forward configurations for head dim 256 (needs TUNE_ARCH=90a, tune.py's default).
#include "sm90_fwd_config_launch.h"
#include "variants.h"
using flashattn::sm90::FwdConfig;
void add_fwd_variants_sm90_256(std::vector<FwdVariant>& out) {
  FLASHATTN_SM90_FWD_VARIANT(256, FwdConfig<256, 64, 2>)
  FLASHATTN_SM90_FWD_VARIANT(256, FwdConfig<256, 80, 2>)
}
