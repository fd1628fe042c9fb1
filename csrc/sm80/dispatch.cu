// Picks the compiled kernel for (element type, padded head dim).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "sm80/api.h"
#include "sm80/head_dims.h"
#include "sm80/kernel_configs.h"
#include "sm80/launch.h"

namespace flashattn {
namespace sm80 {

int padded_head_dim(int head_dim) {
#define FLASHATTN_PICK_SMALLEST(D) \
  if (head_dim <= D) return D;
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_PICK_SMALLEST)
#undef FLASHATTN_PICK_SMALLEST
  return 0;
}

namespace {

// f(Configs{}) with the FwdConfigs / BwdConfigs list of the tile width serving head_dim; `none` when
// no compiled width does.
template <template <int> class ConfigsOf, typename F, typename R>
R with_configs(int head_dim, F&& f, R none) {
  const int padded = padded_head_dim(head_dim);
#define FLASHATTN_CONFIGS(D) \
  if (padded == D) return f(typename ConfigsOf<D>::type{});
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_CONFIGS)
#undef FLASHATTN_CONFIGS
  return none;
}

// The first entry of a configuration list whose shared memory (bytes_of(Config{})) fits `limit`
// bytes (0: not known, entry 0); the last, smallest one when none fits (its plan then says so).
template <typename List, typename Bytes>
int first_fit(int limit, Bytes&& bytes_of) {
  for (int i = 0; i < List::kCount; ++i) {
    const int bytes = with_config<List>(i, bytes_of);
    if (limit <= 0 || bytes <= limit) return i;
  }
  return List::kCount - 1;
}

template <typename Cfg>
int fwd_bytes(bool masked) {
  return Cfg::kSmemBytes + (masked ? Cfg::kKeepBitsBytes : 0);
}

// of(Config{}) for configuration `tiles` of the list serving head_dim; `none` when no width does.
template <template <int> class ConfigsOf, typename Of, typename R>
R of_tiles(int head_dim, int tiles, Of&& of, R none) {
  return with_configs<ConfigsOf>(head_dim, [&](auto list) { return with_config<decltype(list)>(tiles, of); }, none);
}

template <template <int> class ConfigsOf>
TileShape tile_shape(int head_dim, int tiles) {
  return of_tiles<ConfigsOf>(head_dim, tiles, [](auto cfg) {
    return TileShape{decltype(cfg)::kBlockM, decltype(cfg)::kBlockN};
  }, TileShape{0, 0});
}

}  // namespace

int fwd_tiles(int head_dim, bool masked, int smem_limit) {
  return with_configs<FwdConfigs>(head_dim, [&](auto list) {
    return first_fit<decltype(list)>(smem_limit, [&](auto cfg) { return fwd_bytes<decltype(cfg)>(masked); });
  }, 0);
}

int bwd_tiles(int head_dim, int smem_limit) {
  return with_configs<BwdConfigs>(head_dim, [&](auto list) {
    return first_fit<decltype(list)>(smem_limit, [](auto cfg) { return decltype(cfg)::kSmemBytes; });
  }, 0);
}

TileShape fwd_tile_shape(int head_dim, int tiles) { return tile_shape<FwdConfigs>(head_dim, tiles); }
TileShape bwd_tile_shape(int head_dim, int tiles) { return tile_shape<BwdConfigs>(head_dim, tiles); }

int fwd_smem_bytes(int head_dim, bool masked, int tiles) {
  return of_tiles<FwdConfigs>(head_dim, tiles, [&](auto cfg) { return fwd_bytes<decltype(cfg)>(masked); }, 0);
}

int bwd_smem_bytes(int head_dim, int tiles) {
  return of_tiles<BwdConfigs>(head_dim, tiles, [](auto cfg) { return decltype(cfg)::kSmemBytes; }, 0);
}

cudaError_t run_fwd(const FwdParams& p, cudaStream_t stream) {
  const int padded = padded_head_dim(p.shape.head_dim);
  const bool bf16 = p.shape.element_type == ElementType::kBFloat16;
  const bool masked = p.mask.kind != MaskKind::kNone || p.dropout.enabled;  // the variant with both
#define FLASHATTN_LAUNCH(D)                                                                                  \
  if (padded == D) {                                                                                         \
    if (masked) return bf16 ? launch_fwd_masked<__nv_bfloat16, D>(p, stream) : launch_fwd_masked<__half, D>(p, stream); \
    return bf16 ? launch_fwd<__nv_bfloat16, D>(p, stream) : launch_fwd<__half, D>(p, stream);               \
  }
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
  return cudaErrorInvalidValue;
}

cudaError_t run_bwd(const BwdParams& p, cudaStream_t stream) {
  const int padded = padded_head_dim(p.shape.head_dim);
  const bool bf16 = p.shape.element_type == ElementType::kBFloat16;
  const bool masked = p.mask.kind != MaskKind::kNone || p.dropout.enabled;  // the variant with both
#define FLASHATTN_LAUNCH(D)                                                                                  \
  if (padded == D) {                                                                                         \
    if (masked) return bf16 ? launch_bwd_masked<__nv_bfloat16, D>(p, stream) : launch_bwd_masked<__half, D>(p, stream); \
    return bf16 ? launch_bwd<__nv_bfloat16, D>(p, stream) : launch_bwd<__half, D>(p, stream);               \
  }
  FLASHATTN_SM80_FOR_EACH_HEAD_DIM(FLASHATTN_LAUNCH)
#undef FLASHATTN_LAUNCH
  return cudaErrorInvalidValue;
}

}  // namespace sm80
}  // namespace flashattn
