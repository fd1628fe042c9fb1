// Attention sinks at the ops' level (the fwd / bwd / varlen ops' `sink` and `dsink` arguments): their
// checks, the float32 copy the kernels read, the merge of a sink into an (out, lse) pair computed
// without it, and the sink's gradient from the backward's row statistics.
//
// A sink is a [Hq] tensor of logits: query head h's rows take softmax over their scores and sink[h],
// and the sink's probability multiplies nothing, so out = sum_j P_j v_j with sum_j P_j < 1 and
// lse = log(exp(sink[h]) + sum_j exp(score_j)). Given that lse, the backward of the scores is the
// usual one; d loss / d sink[h] = -sum over h's rows of exp(sink[h] - lse) * delta, where delta is the
// row's sum_d dout * out.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace flashattn {

// sink: a 1-dim (heads_q,) floating tensor on q's device.
void check_sink(const char* op, const std::optional<at::Tensor>& sink, const at::Tensor& q, int64_t heads_q);

// dsink (the backward's output for the sink's gradient): needs a sink; a contiguous (heads_q,) float32
// tensor on q's device.
void check_dsink(const char* op, const std::optional<at::Tensor>& dsink, const std::optional<at::Tensor>& sink,
                 const at::Tensor& q, int64_t heads_q);

// The sink as the CUDA kernels read it: contiguous float32.
at::Tensor sink_values(const at::Tensor& sink);

// Joins the sink to an (out, lse) pair computed without it, in place: out [..., L, H, D] (a float32
// accumulator, or zeros), lse [..., H, L] natural log (-inf for a row without keys, which keeps out 0 and gets
// lse = sink).
void join_sink(at::Tensor& out, at::Tensor& lse, const at::Tensor& sink);

// d loss / d sink, float32 (heads_q,), from the CUDA backward's row workspaces, [B, Hq, R] each: lse_log2
// (base 2) and delta, whose padding rows hold +inf and 0.
at::Tensor sink_gradient(const at::Tensor& sink, const at::Tensor& lse_log2, const at::Tensor& delta);

// The same from the rows themselves: dout and out [B, L, Hq, D], lse [B, Hq, L] natural log.
at::Tensor sink_gradient_of_rows(const at::Tensor& sink, const at::Tensor& dout, const at::Tensor& out,
                                 const at::Tensor& lse);

}  // namespace flashattn
