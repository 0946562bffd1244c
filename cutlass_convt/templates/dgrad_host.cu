// cutlass_convt: host library of one emitted CUTLASS kernel (ConvtKernel from operation.h).
// Host code only: it checks a problem with CUTLASS's can_implement and fills the kernel's
// Params, which the Python launcher copies, patches with the tensors' addresses and passes to
// cuLaunchKernel. No CUDA runtime calls (the runtime nvcc links in stays unused).
#include <cstdint>
#include <cstring>

#include "operation.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"

namespace {

using Device = cutlass::conv::device::ImplicitGemmConvolution<ConvtKernel>;
using Params = typename ConvtKernel::Params;

template <typename Member>
int64_t offset_of(Member Params::*member) {
  Params probe;
  return reinterpret_cast<char const *>(&(probe.*member)) - reinterpret_cast<char const *>(&probe);
}

}  // namespace

extern "C" {

// Version of this C interface; the launcher refuses a library with another.
int cutlass_convt_abi_version() { return 2; }

// out[0] threads per block, out[1] dynamic shared memory (bytes), out[2] sizeof(Params),
// out[3..6] byte offsets in Params of ptr_A (x), ptr_B (filter), ptr_C (bias), ptr_D (y).
void cutlass_convt_describe(int64_t *out) {
  out[0] = ConvtKernel::kThreadCount;
  out[1] = static_cast<int64_t>(sizeof(typename ConvtKernel::SharedStorage));
  out[2] = static_cast<int64_t>(sizeof(Params));
  out[3] = offset_of(&Params::ptr_A);
  out[4] = offset_of(&Params::ptr_B);
  out[5] = offset_of(&Params::ptr_C);
  out[6] = offset_of(&Params::ptr_D);
}

// problem: N, H, W, C, K, R, S, P, Q, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w
// (cutlass::conv::Conv2dProblemSize, cross-correlation). x_strides and y_strides: the (W, H, N)
// strides in elements of the NHWC x (dgrad's output gradient, A) and y (dgrad's result, D);
// channels are contiguous. The KRSC filter is packed. The bias is read through a C operand of
// stride 0 (one row broadcast over all output pixels) and added with beta = 1 when has_bias,
// not read at all when beta = 0.
// Writes sizeof(Params) bytes (null tensor addresses) to params_out and the grid to grid_out[3].
// Returns the cutlass::Status of can_implement (0 = kSuccess).
int cutlass_convt_initialize(int32_t const *problem, int64_t const *x_strides,
                             int64_t const *y_strides, int32_t has_bias, void *params_out,
                             int32_t *grid_out) {
  int32_t const *p = problem;
  cutlass::conv::Conv2dProblemSize problem_size(
      p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13],
      p[14], cutlass::conv::Mode::kCrossCorrelation, 1, 1);

  using LayoutA = typename ConvtKernel::LayoutA;
  using LayoutB = typename ConvtKernel::LayoutB;
  using LayoutC = typename ConvtKernel::LayoutC;

  auto extent_b = cutlass::conv::implicit_gemm_tensor_b_extent(
      cutlass::conv::Operator::kDgrad, problem_size);
  auto nhwc_stride = [](int64_t const *s) {  // TensorNHWC keeps 32-bit strides
    return cutlass::make_Coord(int(s[0]), int(s[1]), int(s[2]));
  };

  typename ConvtKernel::TensorRefA ref_a(nullptr, LayoutA(nhwc_stride(x_strides)));
  typename ConvtKernel::TensorRefB ref_b(nullptr, LayoutB::packed(extent_b));
  typename ConvtKernel::TensorRefC ref_c(nullptr, LayoutC(typename LayoutC::Stride(0)));
  typename ConvtKernel::TensorRefC ref_d(nullptr, LayoutC(nhwc_stride(y_strides)));

  typename Device::Arguments arguments(
      problem_size, ref_a, ref_b, ref_c, ref_d,
      {1.0f, has_bias ? 1.0f : 0.0f});

  cutlass::Status status = Device::can_implement(arguments);
  if (status != cutlass::Status::kSuccess) {
    return static_cast<int>(status);
  }
  Params params(arguments, nullptr);
  std::memcpy(params_out, &params, sizeof(Params));

  dim3 grid = typename ConvtKernel::ThreadblockSwizzle().get_grid_shape(params.grid_tiled_shape);
  grid_out[0] = static_cast<int32_t>(grid.x);
  grid_out[1] = static_cast<int32_t>(grid.y);
  grid_out[2] = static_cast<int32_t>(grid.z);
  return 0;
}

}  // extern "C"
