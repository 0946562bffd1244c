// cutlass_convt: the tensors' element type of a kernel built for float32, float16 or bfloat16
// (config.h's kHalf and kBf16; neither: float32), and its conversions. Included after config.h
// by phase.cu and the strip family's templates. 16-bit values are rounded to nearest even once,
// where a float32 sum becomes an output element.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace {

using Element = std::conditional_t<kBf16, __nv_bfloat16, std::conditional_t<kHalf, __half, float>>;
constexpr bool kSixteen = kHalf || kBf16;
static_assert(!(kHalf && kBf16), "one element type");

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// v as an E (16-bit: rounded to nearest even)
template <typename E>
__device__ __forceinline__ E to_element(float v);
template <>
__device__ __forceinline__ float to_element<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half to_element<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 to_element<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
__device__ __forceinline__ Element from_float(float v) { return to_element<Element>(v); }

// Two consecutive elements (an address aligned to their size).
__device__ __forceinline__ void store_pair(float *out, float v0, float v1) {
  *reinterpret_cast<float2 *>(out) = make_float2(v0, v1);
}
__device__ __forceinline__ void store_pair(__half *out, float v0, float v1) {
  *reinterpret_cast<__half2 *>(out) = __floats2half2_rn(v0, v1);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16 *out, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162 *>(out) = __floats2bfloat162_rn(v0, v1);
}

// v0 and v1 as two 16-bit elements in one word, v0 in the low half (the order in memory).
template <typename E = Element>
__device__ __forceinline__ uint32_t pack_pair(float v0, float v1) {
  static_assert(sizeof(E) == 2, "two 16-bit elements");
  E pair[2] = {to_element<E>(v0), to_element<E>(v1)};
  return *reinterpret_cast<uint32_t const *>(pair);
}

}  // namespace
