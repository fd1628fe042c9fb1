// Placeholder until the CPU implementation lands.
#include "cpu/attention_cpu.h"

#include <c10/util/Exception.h>

namespace flashattn {
namespace cpu {

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, bool,
                                       int64_t) {
  TORCH_CHECK(false, "flashattn.fwd: CPU implementation not built");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                                   bool, int64_t) {
  TORCH_CHECK(false, "flashattn.bwd: CPU implementation not built");
}

}  // namespace cpu
}  // namespace flashattn
