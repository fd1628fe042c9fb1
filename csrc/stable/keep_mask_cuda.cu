// The GPU writer of the stable-ABI keep-mask op (keep_mask.h): the kernel of cuda/dropout_keep_mask.cu.
#include <cuda_runtime.h>

#include "common/dropout.h"
#include "cuda/api.h"
#include "stable/keep_mask.h"

namespace flashattn {
namespace stable_ops {

std::string launch_keep_mask_cuda(const int64_t* rng_state, double dropout_p, int64_t batch_heads, int64_t seqlen_q,
                                  int64_t seqlen_k, bool* keep, void* stream) {
  DropoutParams d;
  d.enabled = true;
  d.threshold = dropout_threshold(dropout_p);
  d.rng_state = rng_state;
  const cudaError_t err = write_dropout_keep_mask(d, batch_heads, static_cast<int>(seqlen_q),
                                                  static_cast<int>(seqlen_k), keep, static_cast<cudaStream_t>(stream));
  return err == cudaSuccess ? std::string() : std::string(cudaGetErrorString(err));
}

}  // namespace stable_ops
}  // namespace flashattn
