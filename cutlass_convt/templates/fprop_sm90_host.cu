// cutlass_convt: host library of one emitted CUTLASS 3.x SM90 fprop kernel (ConvtKernel from
// operation.h; TMA im2col loads of the activation, TMA tiled loads of the filter, wgmma math
// (TF32 on float32, or float16 / bfloat16 operands; float32 sums), TMA epilogue, a per-channel
// bias when operation.h sets CUTLASS_CONVT_BIAS).
//
// Unlike the SM80 kernels, the tensors' addresses are not plain pointers in Params: they live
// inside the CUtensorMap TMA descriptors, which only the driver can encode. So Params is built
// anew for every set of pointers, by cutlass_convt_sm90_params(), with the kernel's own
// to_underlying_arguments(). The launcher copies the bytes and passes them to cuLaunchKernel.
//
// Driver access without the CUDA runtime and without linking libcuda:
// CUTLASS 4.2 encodes TMA descriptors through CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncode*)
// (cutlass/cuda_host_adapter.hpp). By default that resolves the driver function with the runtime's
// cudaGetDriverEntryPointByVersion (needs cudart). With CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL it
// calls cuTensorMapEncodeTiled / cuTensorMapEncodeIm2col directly (needs -lcuda at link time).
// We take the direct path but rename the two calls, before the CUTLASS headers are read, to the
// file-local functions below, which look the driver function up in libcuda.so.1 with dlopen/dlsym
// at the first call (in the launching process libcuda.so.1 is already loaded, by cuda-python) and
// remember whether the encode failed: CUTLASS only assert()s on the result, and with -DNDEBUG a
// failed encode would otherwise go unnoticed.
//
// Build (host code only; the exact command is FpropSm90Family.sources + build.nvcc_commands):
//   nvcc -std=c++17 -DNDEBUG --expt-relaxed-constexpr -O2 -Xlinker --no-undefined
//        -I<cutlass>/include -I<cutlass>/tools/util/include -shared -Xcompiler=-fPIC
//        -o libhost.so fprop_sm90_host.cu -ldl
#include <cstdint>
#include <cstring>

#include <dlfcn.h>

#include <cuda.h>          // CUresult, CUtensorMap, ... (types only; nothing is linked)
#include <cudaTypedefs.h>  // read now, before the renames below

namespace {

// Outcome of the TMA descriptor encodes of the current cutlass_convt_sm90_params() call.
thread_local bool g_driver_missing = false;
thread_local CUresult g_encode_result = CUDA_SUCCESS;

// A symbol of the driver library, or null where there is no driver (e.g. a machine without GPU).
void *driver_symbol(char const *name) {
  static void *const library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return library ? dlsym(library, name) : nullptr;
}

// Calls the driver's function `name` of type Fn, recording a missing driver or a failure.
template <class Fn, class... Args>
CUresult call_driver(char const *name, Args... args) {
  auto fn = reinterpret_cast<Fn>(driver_symbol(name));
  if (fn == nullptr) {
    g_driver_missing = true;
    return CUDA_ERROR_NOT_FOUND;
  }
  CUresult result = fn(args...);
  if (result != CUDA_SUCCESS && g_encode_result == CUDA_SUCCESS) {
    g_encode_result = result;
  }
  return result;
}

template <class... Args>
CUresult cutlass_convt_encode_tiled(Args... args) {
  return call_driver<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", args...);
}

template <class... Args>
CUresult cutlass_convt_encode_im2col(Args... args) {
  return call_driver<PFN_cuTensorMapEncodeIm2col_v12000>("cuTensorMapEncodeIm2col", args...);
}

}  // namespace

// CUTLASS's direct driver calls, renamed to the functions above (see the top of this file).
#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1
#define cuTensorMapEncodeTiled cutlass_convt_encode_tiled
#define cuTensorMapEncodeIm2col cutlass_convt_encode_im2col

#include "operation.h"

namespace {

using Params = typename ConvtKernel::Params;
using Arguments = typename ConvtKernel::Arguments;
using ProblemShape = typename ConvtKernel::ProblemShape;  // cutlass::conv::ConvProblemShape<kFprop, 2>
using ClusterShape = typename ConvtKernel::ClusterShape;
using TileShape = typename ConvtKernel::TileShape;
using ElementA = typename ConvtKernel::CollectiveMainloop::ElementA;  // x
using ElementB = typename ConvtKernel::CollectiveMainloop::ElementB;  // filter
using ElementD = typename ConvtKernel::CollectiveEpilogue::ElementD;  // y

static_assert(ProblemShape::RankS == 2, "a 2-D convolution kernel (NHWC) is expected");

// Return codes of cutlass_convt_sm90_params besides cutlass::Status (0 .. 11).
constexpr int kDriverMissing = 100;   // libcuda.so.1 or cuTensorMapEncode* not found
constexpr int kEncodeFailed = 1000;   // 1000 + the CUresult of the first failed encode

}  // namespace

extern "C" {

// Version of this C interface; the launcher refuses a library with another.
int cutlass_convt_abi_version() { return 4; }

// out[0] threads per block (block = (out[0], 1, 1)), out[1] dynamic shared memory bytes,
// out[2] sizeof(Params), out[3..5] cluster shape (x, y, z): launch with cuLaunchKernelEx and a
// cluster dimension attribute when its product is > 1; out[6] alignof(Params), out[7] pipeline
// stages of the mainloop, out[8..10] the CTA tile (M, N, K). 11 values in all.
void cutlass_convt_sm90_describe(int64_t *out) {
  out[0] = ConvtKernel::MaxThreadsPerBlock;
  out[1] = ConvtKernel::SharedStorageSize;
  out[2] = static_cast<int64_t>(sizeof(Params));
  out[3] = cute::size<0>(ClusterShape{});
  out[4] = cute::size<1>(ClusterShape{});
  out[5] = cute::size<2>(ClusterShape{});
  out[6] = static_cast<int64_t>(alignof(Params));
  out[7] = ConvtKernel::DispatchPolicy::Stages;
  out[8] = cute::size<0>(TileShape{});
  out[9] = cute::size<1>(TileShape{});
  out[10] = cute::size<2>(TileShape{});
}

// problem: N, H, W, C, K, R, S, P, Q, pad_h, pad_w of the forward convolution (cross-correlation,
// stride 1, dilation 1, one group). x: NHWC (N,H,W,C), filter: KRSC (K,R,S,C), y: NPQK, all
// packed, of the kernel's element type, on the device; bias: K values of y's type (read only
// with CUTLASS_CONVT_BIAS; otherwise any aligned address). y = conv(x, filter) + bias (alpha 1,
// beta 0: y is not read).
// The upper padding is whatever makes the output P x Q: P - 1 + R - H - pad_h (so a transposed
// convolution's output_padding is simply a larger P / Q).
// Writes sizeof(Params) bytes to params_out (TMA descriptors: only valid for these x, filter, y)
// and the grid (x, y, z) to grid_out. Returns 0, or a cutlass::Status (4 kErrorInvalidProblem:
// bad sizes / P, Q; 11 kInvalid: can_implement refused, e.g. C or K not 16 bytes of elements;
// 1 kErrorMisalignedOperand: an address not 16-byte aligned), or 100 (no CUDA driver), or
// 1000 + CUresult (a TMA descriptor encode failed).
int cutlass_convt_sm90_params(int32_t const *problem, void const *x, void const *filter, void *y,
                              void const *bias, void *params_out, int32_t *grid_out) {
  int32_t const n = problem[0], h = problem[1], w = problem[2], c = problem[3];
  int32_t const k = problem[4], r = problem[5], s = problem[6];
  int32_t const p = problem[7], q = problem[8], pad_h = problem[9], pad_w = problem[10];
  int32_t const upper_h = p - 1 + r - h - pad_h;
  int32_t const upper_w = q - 1 + s - w - pad_w;
  if (n <= 0 || h <= 0 || w <= 0 || c <= 0 || k <= 0 || r <= 0 || s <= 0 || p <= 0 || q <= 0 ||
      pad_h < 0 || pad_w < 0 || upper_h < 0 || upper_w < 0) {
    return static_cast<int>(cutlass::Status::kErrorInvalidProblem);
  }

  ProblemShape problem_shape(cutlass::conv::Mode::kCrossCorrelation,
                             {n, h, w, c},  // activation, packed NHWC
                             {k, r, s, c},  // filter, packed KRSC
                             {pad_h, pad_w}, {upper_h, upper_w},
                             {1, 1},        // traversal stride
                             {1, 1},        // dilation
                             1);            // groups
  if (problem_shape.shape_C[0] != n || problem_shape.shape_C[1] != p ||
      problem_shape.shape_C[2] != q || problem_shape.shape_C[3] != k) {
    return static_cast<int>(cutlass::Status::kErrorInvalidProblem);
  }

  // Epilogue strides of C and D: ((Q, P, N) pixel strides, 1 along K, 0 along L), taken from the
  // packed output tensor's [n, p, q, k] strides (as in CUTLASS example 76).
  typename ConvtKernel::StrideC stride_c{};
  typename ConvtKernel::StrideD stride_d{};
  cute::for_each(cute::make_seq<cute::rank<0>(decltype(stride_c){})>{}, [&](auto i) {
    cute::get<0, i>(stride_c) = problem_shape.stride_C[ProblemShape::RankT - 2 - i];
    cute::get<0, i>(stride_d) = problem_shape.stride_C[ProblemShape::RankT - 2 - i];
  });

  // beta = 0: the epilogue never loads C, but its TMA descriptor is still encoded from ptr_C, so
  // give it y (a valid, aligned address) instead of null.
  auto *y_out = static_cast<ElementD *>(y);
  typename ConvtKernel::CollectiveEpilogue::Arguments epilogue{{}, y_out, stride_c, y_out,
                                                                stride_d};
  epilogue.thread.alpha = 1.0f;
  epilogue.thread.beta = 0.0f;
#if CUTLASS_CONVT_BIAS
  epilogue.thread.bias_ptr = static_cast<decltype(epilogue.thread.bias_ptr)>(bias);
#endif
  Arguments arguments{
      problem_shape,
      {static_cast<ElementA const *>(x), static_cast<ElementB const *>(filter)},
      epilogue};

  if (!ConvtKernel::can_implement(arguments)) {
    return static_cast<int>(cutlass::Status::kInvalid);  // as ConvUniversalAdapter::can_implement
  }
  if (ConvtKernel::get_workspace_size(arguments) != 0) {
    return static_cast<int>(cutlass::Status::kErrorWorkspaceNull);  // not expected: no workspace
  }

  // TMA requires 16-byte aligned global addresses (the strides were checked by can_implement).
  for (void const *address : {x, filter, static_cast<void const *>(y), bias}) {
    if (address == nullptr || reinterpret_cast<uintptr_t>(address) % 16 != 0) {
      return static_cast<int>(cutlass::Status::kErrorMisalignedOperand);
    }
  }
  // Without a driver CUTLASS would print each failed encode to stderr: say so once instead.
  if (driver_symbol("cuTensorMapEncodeTiled") == nullptr ||
      driver_symbol("cuTensorMapEncodeIm2col") == nullptr) {
    return kDriverMissing;
  }

  g_driver_missing = false;
  g_encode_result = CUDA_SUCCESS;
  Params params = ConvtKernel::to_underlying_arguments(arguments, nullptr);
  if (g_driver_missing) {
    return kDriverMissing;
  }
  if (g_encode_result != CUDA_SUCCESS) {
    return kEncodeFailed + static_cast<int>(g_encode_result);
  }

  std::memcpy(params_out, &params, sizeof(Params));
  dim3 grid = ConvtKernel::get_grid_shape(params);
  grid_out[0] = static_cast<int32_t>(grid.x);
  grid_out[1] = static_cast<int32_t>(grid.y);
  grid_out[2] = static_cast<int32_t>(grid.z);
  return 0;
}

}  // extern "C"
