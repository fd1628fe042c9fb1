// Kernel tile configurations compiled side by side so one GPU run can time them against each other.
// Built on the fly by tune.py (torch.utils.cpp_extension.load); not part of the package.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "params.h"

struct FwdVariant {
  int head_dim;
  const char* name;
  cudaError_t (*launch)(const flashattn::FwdParams&, cudaStream_t);
};
struct BwdVariant {
  int head_dim;
  const char* name;
  cudaError_t (*launch)(const flashattn::BwdParams&, cudaStream_t);
};

void add_fwd_variants_64(std::vector<FwdVariant>& out);
void add_fwd_variants_128(std::vector<FwdVariant>& out);
void add_fwd_variants_sm90_64(std::vector<FwdVariant>& out);
void add_fwd_variants_sm90_128(std::vector<FwdVariant>& out);
void add_fwd_variants_sm90_256(std::vector<FwdVariant>& out);
void add_bwd_variants_64(std::vector<BwdVariant>& out);
void add_bwd_variants_128(std::vector<BwdVariant>& out);
void add_bwd_variants_256(std::vector<BwdVariant>& out);
void add_bwd_variants_sm90(std::vector<BwdVariant>& out);

#define FLASHATTN_FWD_VARIANT(D, ...) \
  out.push_back({D, #__VA_ARGS__, &flashattn::sm80::launch_fwd_with_config<__nv_bfloat16, __VA_ARGS__>});
// Names of sm90 variants start with "sm90" (tune.py's sm90 mode runs only those).
#define FLASHATTN_SM90_FWD_VARIANT(D, ...) \
  out.push_back({D, "sm90 " #__VA_ARGS__, &launch_sm90_fwd_config<__nv_bfloat16, __VA_ARGS__>});
#define FLASHATTN_BWD_VARIANT(D, ...) \
  out.push_back({D, #__VA_ARGS__, &flashattn::sm80::launch_bwd_with_config<__nv_bfloat16, __VA_ARGS__>});
#define FLASHATTN_SM90_BWD_VARIANT(D, ...) \
  out.push_back({D, "sm90 " #__VA_ARGS__, &flashattn::sm90::launch_bwd_with_config<__nv_bfloat16, __VA_ARGS__>});
