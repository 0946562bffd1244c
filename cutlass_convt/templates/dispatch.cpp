// cutlass_convt's per-call path in C++: the Autograd, AutocastCUDA, AutocastCPU and CUDA
// kernels of the op cutlass_convt::conv_transpose2d and the CUDA kernel of its backward.
//
// The schemas are defined in Python (ops.py); this library only implements them. Rules:
// - CUDA: a table maps a call's signature (sizes, strides, dtypes, device, size arguments,
//   precision, backend, PyTorch's TF32 setting for convolutions) to its route as Python
//   decided it (cutlass_convt::_remember). A hit runs without entering Python; a miss calls
//   the Python cold path (cutlass_convt::_route), which validates, chooses, builds and may
//   remember the route. Only PyTorch's own route is remembered here so far (a prepared
//   CUTLASS kernel is run by the cold path).
// - Autograd: the forward is the op below autograd, the backward the op
//   cutlass_convt::conv_transpose2d_backward (aten::convolution_backward).
// - Autocast: PyTorch's policy for conv_transpose2d (lower_precision_fp): floating-point
//   tensors but float64, on the autocast device, cast to the autocast dtype through PyTorch's
//   cast cache.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using at::IntArrayRef;
using at::Tensor;
using OptionalTensor = std::optional<Tensor>;
using OptionalString = std::optional<c10::string_view>;

// ---------------------------------------------------------------------------------------------
// PyTorch's TF32 setting for convolutions, as PyTorch's cuDNN convolutions read it.

bool conv_tf32() {
#if CUTLASS_CONVT_FP32_API == 2  // (backend, op) enums
  return at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV) ==
         at::Float32Precision::TF32;
#elif CUTLASS_CONVT_FP32_API == 1  // (backend, op) strings
  return at::globalContext().float32Precision("cuda", "conv") == "tf32";
#else
  return at::globalContext().allowTF32CuDNN();
#endif
}

// Whether a float32 CUDA call in `precision` ("tf32", "fp32"; none: PyTorch's setting) runs
// in another precision than PyTorch's convolutions would now.
bool precision_differs(const Tensor& input, const OptionalString& precision) {
  if (!precision.has_value() || !input.is_cuda() || input.scalar_type() != at::kFloat) {
    return false;
  }
  return (*precision == "tf32") != conv_tf32();
}

// ---------------------------------------------------------------------------------------------
// The route table.

struct Signature {
  std::vector<int64_t> ints;
  std::string names;  // precision (or a marker for none), backend
  bool operator==(const Signature& o) const { return ints == o.ints && names == o.names; }
};

struct SignatureHash {
  size_t operator()(const Signature& s) const {
    size_t h = std::hash<std::string>()(s.names);
    for (int64_t v : s.ints) {
      h ^= std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return h;
  }
};

void add_tensor(std::vector<int64_t>& ints, const Tensor& t) {
  ints.push_back(t.dim());
  for (int64_t v : t.sizes()) ints.push_back(v);
  for (int64_t v : t.strides()) ints.push_back(v);
  ints.push_back(static_cast<int64_t>(t.scalar_type()));
  ints.push_back(static_cast<int64_t>(t.device().type()));
  ints.push_back(t.device().index());
}

void add_ints(std::vector<int64_t>& ints, IntArrayRef values) {
  ints.push_back(static_cast<int64_t>(values.size()));
  for (int64_t v : values) ints.push_back(v);
}

// The signature of a call; none for tensors that are not plain strided ones.
std::optional<Signature> signature(const Tensor& input, const Tensor& weight,
                                   const OptionalTensor& bias, IntArrayRef stride,
                                   IntArrayRef padding, IntArrayRef output_padding,
                                   int64_t groups, IntArrayRef dilation,
                                   const OptionalString& precision,
                                   c10::string_view backend) {
  if (input.layout() != at::kStrided || weight.layout() != at::kStrided ||
      (bias.has_value() && bias->layout() != at::kStrided)) {
    return std::nullopt;
  }
  Signature s;
  s.ints.reserve(48);
  add_tensor(s.ints, input);
  add_tensor(s.ints, weight);
  if (bias.has_value()) {
    s.ints.push_back(1);
    add_ints(s.ints, bias->sizes());  // (its rank first, as every list's)
    s.ints.push_back(static_cast<int64_t>(bias->scalar_type()));
    s.ints.push_back(static_cast<int64_t>(bias->device().type()));
    s.ints.push_back(bias->device().index());
  } else {
    s.ints.push_back(0);
  }
  add_ints(s.ints, stride);
  add_ints(s.ints, padding);
  add_ints(s.ints, output_padding);
  s.ints.push_back(groups);
  add_ints(s.ints, dilation);
  s.ints.push_back(conv_tf32());
  s.names = precision.has_value() ? std::string(*precision) : std::string("\x01");
  s.names.push_back('\0');
  s.names.append(backend.data(), backend.size());
  return s;
}

// A remembered route: PyTorch's conv_transpose2d, its result in the memory format of
// PyTorch's rule for the call (channels_last when the input or the weight is).
struct Route {
  bool channels_last;
};

constexpr size_t kMaxRoutes = 1024;  // (then the table starts again: a bound on memory)

std::mutex table_mutex;
std::unordered_map<Signature, Route, SignatureHash> table;

std::optional<Route> find_route(const Signature& s) {
  std::lock_guard<std::mutex> lock(table_mutex);
  auto it = table.find(s);
  if (it == table.end()) return std::nullopt;
  return it->second;
}

Tensor in_memory_format(Tensor y, bool channels_last) {
  auto form = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (y.dim() == 4) {
    return y.is_contiguous(form) ? y : y.contiguous(form);
  }
  Tensor batched = y.unsqueeze(0);
  return batched.is_contiguous(form) ? y : batched.contiguous(form).squeeze(0);
}

Tensor run_route(const Route& route, const Tensor& input, const Tensor& weight,
                 const OptionalTensor& bias, IntArrayRef stride, IntArrayRef padding,
                 IntArrayRef output_padding, int64_t groups, IntArrayRef dilation) {
  Tensor y = at::conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups,
                                  dilation);
  return in_memory_format(std::move(y), route.channels_last);
}

// ---------------------------------------------------------------------------------------------
// The kernels.

using Forward = Tensor(const Tensor&, const Tensor&, const OptionalTensor&, IntArrayRef,
                       IntArrayRef, IntArrayRef, int64_t, IntArrayRef, OptionalString,
                       c10::string_view);
using Backward = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                    bool, IntArrayRef, IntArrayRef, IntArrayRef,
                                                    int64_t, IntArrayRef, OptionalString,
                                                    std::array<bool, 3>);

// The op `name` of the namespace (its schema is Python's, defined before this library loads).
template <typename Signature>
c10::TypedOperatorHandle<Signature> handle(const char* name) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow((std::string("cutlass_convt::") + name).c_str(), "")
      .template typed<Signature>();
}

// CUDA: a remembered route, else the Python cold path.
Tensor cuda_kernel(const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
                   IntArrayRef stride, IntArrayRef padding, IntArrayRef output_padding,
                   int64_t groups, IntArrayRef dilation, OptionalString precision,
                   c10::string_view backend) {
  auto s = signature(input, weight, bias, stride, padding, output_padding, groups, dilation,
                     precision, backend);
  if (s.has_value()) {
    if (auto route = find_route(*s)) {
      return run_route(*route, input, weight, bias, stride, padding, output_padding, groups,
                       dilation);
    }
  }
  static const auto cold = handle<Forward>("_route");
  return cold.call(input, weight, bias, stride, padding, output_padding, groups, dilation,
                   precision, backend);
}

// cutlass_convt::_remember: the cold path's decision for a call, PyTorch's route (kind 0)
// with its result channels_last or not, kept for the call's signature.
void remember(const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
              IntArrayRef stride, IntArrayRef padding, IntArrayRef output_padding,
              int64_t groups, IntArrayRef dilation, OptionalString precision,
              c10::string_view backend, int64_t kind, bool channels_last) {
  TORCH_CHECK(kind == 0, "cutlass_convt::_remember: unknown route kind ", kind);
  auto s = signature(input, weight, bias, stride, padding, output_padding, groups, dilation,
                     precision, backend);
  if (!s.has_value() || precision_differs(input, precision)) {
    return;  // (a route that sets PyTorch's switch stays on the Python path)
  }
  std::lock_guard<std::mutex> lock(table_mutex);
  if (table.size() >= kMaxRoutes) table.clear();
  table[*s] = Route{channels_last};
}

// cutlass_convt::_forget: empty the table (ops.clear_caches).
void forget() {
  std::lock_guard<std::mutex> lock(table_mutex);
  table.clear();
}

// cutlass_convt::_remembered: the number of routes in the table (tests).
int64_t remembered() {
  std::lock_guard<std::mutex> lock(table_mutex);
  return static_cast<int64_t>(table.size());
}

// Autograd: the op below autograd, the backward op for its gradients.
class Differentiable : public torch::autograd::Function<Differentiable> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& input,
                        const Tensor& weight, const OptionalTensor& bias, IntArrayRef stride,
                        IntArrayRef padding, IntArrayRef output_padding, int64_t groups,
                        IntArrayRef dilation, OptionalString precision,
                        c10::string_view backend) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["bias"] = bias.has_value();
    ctx->saved_data["stride"] = stride.vec();
    ctx->saved_data["padding"] = padding.vec();
    ctx->saved_data["output_padding"] = output_padding.vec();
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["dilation"] = dilation.vec();
    if (precision.has_value()) ctx->saved_data["precision"] = std::string(*precision);
    at::AutoDispatchBelowADInplaceOrView guard;
    static const auto forward_op = handle<Forward>("conv_transpose2d");
    return forward_op.call(input, weight, bias, stride, padding, output_padding, groups,
                           dilation, precision, backend);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto backward_op = handle<Backward>("conv_transpose2d_backward");
    auto saved = ctx->get_saved_variables();
    auto& data = ctx->saved_data;
    bool bias = data["bias"].toBool();  // (no bias: no edge of index 2 to ask about)
    std::array<bool, 3> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                bias && ctx->needs_input_grad(2)};
    std::optional<std::string> precision;
    if (data.count("precision")) precision = data["precision"].toStringRef();
    OptionalString precision_view;
    if (precision.has_value()) precision_view = c10::string_view(*precision);
    auto stride = data["stride"].toIntVector(), padding = data["padding"].toIntVector(),
         output_padding = data["output_padding"].toIntVector(),
         dilation = data["dilation"].toIntVector();
    auto [grad_input, grad_weight, grad_bias] = backward_op.call(
        grads[0], saved[0], saved[1], bias, stride, padding, output_padding,
        data["groups"].toInt(), dilation, precision_view, mask);
    return {mask[0] ? grad_input : Tensor(), mask[1] ? grad_weight : Tensor(),
            mask[2] ? grad_bias : Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(),
            Tensor(), Tensor()};
  }
};

Tensor autograd_kernel(const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
                       IntArrayRef stride, IntArrayRef padding, IntArrayRef output_padding,
                       int64_t groups, IntArrayRef dilation, OptionalString precision,
                       c10::string_view backend) {
  return Differentiable::apply(input, weight, bias, stride, padding, output_padding, groups,
                               dilation, precision, backend);
}

template <c10::DeviceType kDevice, c10::DispatchKey kKey>
Tensor autocast_kernel(const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
                       IntArrayRef stride, IntArrayRef padding, IntArrayRef output_padding,
                       int64_t groups, IntArrayRef dilation, OptionalString precision,
                       c10::string_view backend) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
  auto dtype = at::autocast::get_autocast_dtype(kDevice);
  static const auto forward_op = handle<Forward>("conv_transpose2d");
  return forward_op.call(at::autocast::cached_cast(dtype, input, kDevice),
                         at::autocast::cached_cast(dtype, weight, kDevice),
                         at::autocast::cached_cast(dtype, bias, kDevice), stride, padding,
                         output_padding, groups, dilation, precision, backend);
}

// The backward on CUDA where no switch of PyTorch's TF32 setting is needed:
// aten::convolution_backward, grad_input in the input's memory format (PyTorch's rule for a
// 4-D tensor), gradients not asked for empty; else the Python kernel (which sets the switch
// under its lock).
std::tuple<Tensor, Tensor, Tensor> backward_kernel(
    const Tensor& grad, const Tensor& input, const Tensor& weight, bool bias, IntArrayRef stride,
    IntArrayRef padding, IntArrayRef output_padding, int64_t groups, IntArrayRef dilation,
    OptionalString precision, std::array<bool, 3> mask) {
  if (precision_differs(input, precision)) {
    static const auto python = handle<Backward>("_backward_switched");
    return python.call(grad, input, weight, bias, stride, padding, output_padding, groups,
                       dilation, precision, mask);
  }
  bool unbatched = input.dim() == 3;
  Tensor x = unbatched ? input.unsqueeze(0) : input;
  Tensor g = unbatched ? grad.unsqueeze(0) : grad;
  std::array<int64_t, 1> bias_size = {weight.size(1) * groups};
  at::OptionalIntArrayRef bias_sizes;
  if (bias) bias_sizes = IntArrayRef(bias_size);
  auto [grad_x, grad_w, grad_b] = at::convolution_backward(
      g, x, weight, bias_sizes, stride, padding, dilation, true, output_padding, groups, mask);
  Tensor empty = input.new_empty({0});
  if (grad_x.defined()) {
    grad_x = grad_x.contiguous(x.suggest_memory_format());
    if (unbatched) grad_x = grad_x.squeeze(0);
  }
  return std::make_tuple(grad_x.defined() ? grad_x : empty,
                         grad_w.defined() ? grad_w.contiguous() : empty,
                         grad_b.defined() ? grad_b : empty);
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_convt, CUDA, m) {
  m.impl("conv_transpose2d", cuda_kernel);
  m.impl("conv_transpose2d_backward", backward_kernel);
}

TORCH_LIBRARY_IMPL(cutlass_convt, Autograd, m) { m.impl("conv_transpose2d", autograd_kernel); }

TORCH_LIBRARY_IMPL(cutlass_convt, AutocastCUDA, m) {
  m.impl("conv_transpose2d", autocast_kernel<c10::DeviceType::CUDA, c10::DispatchKey::AutocastCUDA>);
}

TORCH_LIBRARY_IMPL(cutlass_convt, AutocastCPU, m) {
  m.impl("conv_transpose2d", autocast_kernel<c10::DeviceType::CPU, c10::DispatchKey::AutocastCPU>);
}

TORCH_LIBRARY_IMPL(cutlass_convt, CompositeImplicitAutograd, m) {
  m.impl("_remember", remember);
  m.impl("_forget", forget);
  m.impl("_remembered", remembered);
}
