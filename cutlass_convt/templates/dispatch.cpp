// cutlass_convt's per-call path in C++: the Autograd, AutocastCUDA, AutocastCPU and CUDA
// kernels of the op cutlass_convt::conv_transpose2d and the CUDA kernel of its backward.
//
// The schemas are defined in Python (ops.py); this library only implements them. Rules:
// - CUDA: a table maps a call's signature (sizes, strides, dtypes, device, size arguments,
//   precision, backend, PyTorch's TF32 setting for convolutions) to its route as Python
//   decided it (cutlass_convt::_remember). A hit runs without entering Python; a miss calls
//   the Python cold path (cutlass_convt::_route), which validates, chooses, builds and may
//   remember the route: PyTorch's own, or a program (program.py: a family's steps for the
//   call's signature, recorded once) that this library replays.
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

#if CUTLASS_CONVT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>
#endif

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
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

// A remembered route: PyTorch's conv_transpose2d (no steps), its result in the memory format
// of PyTorch's rule for the call (channels_last when the input or the weight is); or a
// program: program.py's steps and the bytes they name.
struct Route {
  bool channels_last;
  std::shared_ptr<const std::vector<int64_t>> steps;
  std::shared_ptr<const std::vector<uint64_t>> blob;  // (8-byte aligned bytes)
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

// ---------------------------------------------------------------------------------------------
// Programs (program.py's step codes and argument kinds).

enum Step : int64_t { PACK, NEW, SCRATCH, CHECK, LAUNCH, TRANSFORM, REPEAT, HOST_PARAMS, RESULT };
enum Argument : int64_t { BYTES, MAP };

#if CUTLASS_CONVT_WITH_CUDA
// The driver entry points a replay calls, from the driver PyTorch loaded (libcuda.so.1).
struct Driver {
  using Launch = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);
  using Replace = int (*)(void*, void*);
  Launch launch = nullptr;
  Replace replace_address = nullptr;
  Driver() {
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (library == nullptr) library = dlopen("libcuda.so.1", RTLD_NOW);
    if (library != nullptr) {
      launch = reinterpret_cast<Launch>(dlsym(library, "cuLaunchKernel"));
      replace_address = reinterpret_cast<Replace>(dlsym(library, "cuTensorMapReplaceAddress"));
    }
  }
};

const Driver& driver() {
  static const Driver found;
  return found;
}

struct alignas(64) TensorMap {  // CUtensorMap's size and alignment
  uint64_t words[16];
};

using HostParams = int (*)(const int32_t*, const void*, const void*, void*, const void*, void*,
                           int32_t*);

// The address of a step's reference: slot's data plus delta bytes; slot -1: delta itself.
uint64_t reference(const std::vector<Tensor>& slots, int64_t slot, int64_t delta) {
  if (slot < 0) return static_cast<uint64_t>(delta);
  return reinterpret_cast<uint64_t>(slots.at(slot).data_ptr()) + static_cast<uint64_t>(delta);
}

Tensor replay(const Route& route, const Tensor& input, const Tensor& weight,
              const OptionalTensor& bias) {
  const auto& steps = *route.steps;
  const auto* blob = reinterpret_cast<const uint8_t*>(route.blob->data());
  c10::cuda::CUDAGuard guard(input.device());
  auto stream = c10::cuda::getCurrentCUDAStream(input.device().index()).stream();
  std::vector<Tensor> slots = {input.dim() == 3 ? input.unsqueeze(0) : input, weight,
                               bias.has_value() ? *bias : Tensor()};
  auto put = [&slots](int64_t slot, Tensor t) {
    if (static_cast<int64_t>(slots.size()) <= slot) slots.resize(slot + 1);
    slots[slot] = std::move(t);
  };
  Tensor result;
  size_t pc = 0;
  auto next = [&]() { return steps.at(pc++); };
  while (pc < steps.size()) {
    switch (next()) {
      case PACK: {
        int64_t dst = next(), src = next(), form = next(), alignment = next();
        auto format = form ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
        Tensor t = slots.at(src);
        if (!t.is_contiguous(format)) t = t.contiguous(format);
        if (reinterpret_cast<uint64_t>(t.data_ptr()) % alignment) t = t.clone(format);
        put(dst, std::move(t));
        break;
      }
      case NEW: {
        int64_t dst = next(), like = next(), n = next(), c = next(), h = next(), w = next();
        bool cl = next();
        std::vector<int64_t> strides =
            cl ? std::vector<int64_t>{c * h * w, 1, w * c, c}
               : std::vector<int64_t>{c * h * w, h * w, w, 1};
        put(dst, at::empty_strided({n, c, h, w}, strides, slots.at(like).options()));
        break;
      }
      case SCRATCH: {
        int64_t dst = next(), like = next(), elements = next();
        put(dst, at::empty({elements}, slots.at(like).options()));
        break;
      }
      case CHECK: {  // the operand contract (program.address)
        int64_t slot = next(), rank = next();
        std::vector<int64_t> shape(rank);
        for (auto& v : shape) v = next();
        auto dtype = static_cast<at::ScalarType>(next());
        int64_t alignment = next();
        bool cl = next();
        const Tensor& t = slots.at(slot);
        bool packed = cl ? t.is_contiguous(at::MemoryFormat::ChannelsLast) : t.is_contiguous();
        TORCH_CHECK(t.sizes() == IntArrayRef(shape) && t.scalar_type() == dtype && packed &&
                        reinterpret_cast<uint64_t>(t.data_ptr()) % alignment == 0,
                    "cutlass_convt internal error: an operand of a replayed program is ",
                    t.sizes(), " ", t.scalar_type(), " with strides ", t.strides(),
                    "; the kernel reads ", IntArrayRef(shape), " ", dtype, " packed ",
                    cl ? "NHWC" : "row-major", " at a multiple of ", alignment, " bytes");
        break;
      }
      case TRANSFORM: {
        int64_t dst = next(), src = next();
        std::vector<int64_t> flip(next());
        for (auto& v : flip) v = next();
        std::vector<int64_t> permute(next());
        for (auto& v : permute) v = next();
        std::vector<int64_t> shape(next());
        for (auto& v : shape) v = next();
        put(dst, slots.at(src).flip(flip).permute(permute).reshape(shape).contiguous());
        break;
      }
      case REPEAT: {
        int64_t dst = next(), src = next(), times = next();
        put(dst, slots.at(src).repeat({times}));
        break;
      }
      case LAUNCH: {
        void* kernel = reinterpret_cast<void*>(next());
        unsigned grid[3], block[3];
        for (auto& v : grid) v = static_cast<unsigned>(next());
        for (auto& v : block) v = static_cast<unsigned>(next());
        auto shared = static_cast<unsigned>(next());
        int64_t count = next();
        std::vector<std::vector<uint64_t>> values(count);
        std::vector<TensorMap> maps(count);  // (a CUtensorMap is 64-byte aligned)
        std::vector<void*> pointers(count);
        for (int64_t i = 0; i < count; ++i) {
          int64_t kind = next();
          if (kind == MAP) {
            int64_t offset = next(), length = next(), slot = next(), delta = next();
            TORCH_CHECK(length == sizeof(TensorMap), "cutlass_convt: bad tensor map step");
            std::memcpy(maps[i].words, blob + offset, length);
            void* address = reinterpret_cast<void*>(reference(slots, slot, delta));
            TORCH_CHECK(driver().replace_address != nullptr &&
                            driver().replace_address(maps[i].words, address) == 0,
                        "cutlass_convt: cuTensorMapReplaceAddress failed");
            pointers[i] = maps[i].words;
            continue;
          }
          if (kind == BYTES) {
            int64_t offset = next(), length = next();
            values[i].resize((length + 7) / 8);
            std::memcpy(values[i].data(), blob + offset, length);
            int64_t patches = next();
            auto* bytes = reinterpret_cast<uint8_t*>(values[i].data());
            for (int64_t j = 0; j < patches; ++j) {
              int64_t at = next(), slot = next(), delta = next();
              uint64_t address = reference(slots, slot, delta);
              std::memcpy(bytes + at, &address, sizeof(address));
            }
          } else {  // HOST_PARAMS: the kernel's Params built by its host library
            TORCH_CHECK(kind == HOST_PARAMS, "cutlass_convt: bad program argument ", kind);
            auto function = reinterpret_cast<HostParams>(next());
            int64_t plan = next(), plan_length = next(), size = next(), count_pointers = next();
            TORCH_CHECK(plan_length == 11 * 4 && count_pointers == 4,
                        "cutlass_convt: bad host-params step");
            uint64_t address[4];
            for (auto& a : address) {
              int64_t slot = next(), delta = next();
              a = reference(slots, slot, delta);
            }
            values[i].resize((size + 7) / 8);
            int32_t host_grid[3];
            int status = function(reinterpret_cast<const int32_t*>(blob + plan),
                                  reinterpret_cast<const void*>(address[0]),
                                  reinterpret_cast<const void*>(address[1]),
                                  reinterpret_cast<void*>(address[2]),
                                  reinterpret_cast<const void*>(address[3]), values[i].data(),
                                  host_grid);
            TORCH_CHECK(status == 0, "cutlass_convt: the kernel's host library refused a "
                        "replayed call (status ", status, ")");
          }
          pointers[i] = values[i].data();
        }
        TORCH_CHECK(driver().launch != nullptr, "cutlass_convt: no cuLaunchKernel");
        int err = driver().launch(kernel, grid[0], grid[1], grid[2], block[0], block[1],
                                  block[2], shared, stream, pointers.data(), nullptr);
        TORCH_CHECK(err == 0, "cutlass_convt: cuLaunchKernel failed with CUresult ", err);
        break;
      }
      case RESULT:
        result = slots.at(next());
        break;
      default:
        TORCH_CHECK(false, "cutlass_convt: bad program step");
    }
  }
  return input.dim() == 3 ? result.squeeze(0) : result;
}
#endif

Tensor run_route(const Route& route, const Tensor& input, const Tensor& weight,
                 const OptionalTensor& bias, IntArrayRef stride, IntArrayRef padding,
                 IntArrayRef output_padding, int64_t groups, IntArrayRef dilation) {
#if CUTLASS_CONVT_WITH_CUDA
  if (route.steps) return replay(route, input, weight, bias);
#endif
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

// cutlass_convt::_remember: the cold path's decision for a call, kept for the call's
// signature: PyTorch's route (kind 0) with its result channels_last or not, or a program
// (kind 1: program.py's steps and the bytes they name, a uint8 CPU tensor).
void remember(const Tensor& input, const Tensor& weight, const OptionalTensor& bias,
              IntArrayRef stride, IntArrayRef padding, IntArrayRef output_padding,
              int64_t groups, IntArrayRef dilation, OptionalString precision,
              c10::string_view backend, int64_t kind, bool channels_last, IntArrayRef steps,
              const OptionalTensor& blob) {
  TORCH_CHECK(kind == 0 || kind == 1, "cutlass_convt::_remember: unknown route kind ", kind);
  auto s = signature(input, weight, bias, stride, padding, output_padding, groups, dilation,
                     precision, backend);
  if (!s.has_value() || (kind == 0 && precision_differs(input, precision))) {
    return;  // (a PyTorch route that sets PyTorch's switch stays on the Python path; our
             // kernels do not read it)
  }
  Route route{channels_last, nullptr, nullptr};
  if (kind == 1) {
#if CUTLASS_CONVT_WITH_CUDA
    TORCH_CHECK(blob.has_value() && blob->scalar_type() == at::kByte && blob->is_cpu() &&
                    blob->is_contiguous(),
                "cutlass_convt::_remember: a program's bytes are a packed uint8 CPU tensor");
    route.steps = std::make_shared<const std::vector<int64_t>>(steps.vec());
    std::vector<uint64_t> words((blob->numel() + 7) / 8);
    std::memcpy(words.data(), blob->data_ptr(), blob->numel());
    route.blob = std::make_shared<const std::vector<uint64_t>>(std::move(words));
#else
    return;  // (no CUDA in this PyTorch: nothing to replay)
#endif
  }
  std::lock_guard<std::mutex> lock(table_mutex);
  if (table.size() >= kMaxRoutes) table.clear();
  table[*s] = std::move(route);
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
