// Hopper forward configurations for head dim 64 (needs TUNE_ARCH=90a, tune.py's default).
#include "sm90_fwd_config_launch.h"
#include "variants.h"
using flashattn::sm90::FwdConfig;
void add_fwd_variants_sm90_64(std::vector<FwdVariant>& out) {
  FLASHATTN_SM90_FWD_VARIANT(64, FwdConfig<64, 128, 4>)
  FLASHATTN_SM90_FWD_VARIANT(64, FwdConfig<64, 128, 2>)
  FLASHATTN_SM90_FWD_VARIANT(64, FwdConfig<64, 192, 3>)
}
