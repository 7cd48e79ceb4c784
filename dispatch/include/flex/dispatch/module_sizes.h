#pragma once
// Module sizes as Accelerate 1.2 computes them for device-map planning.
//
// Sizes are doubles: a bool element counts 1/8 byte (Accelerate's
// dtype_byte_size), so models with bool causal masks get sizes like 483336.0.
// Parameters and buffers, non-persistent buffers included, are counted;
// a tensor reachable under several names (tied weights) counts once, under
// the first name in PyTorch's named_parameters() order.
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace flex {

/// Bytes per element as Accelerate counts them: bool 1/8, else the element size.
double dtype_byte_size(at::ScalarType dtype);

/// "float16", "torch.float16", "fp16", "half", "bfloat16", "float32", "int8", ...
/// ConfigError naming the string otherwise.
at::ScalarType dtype_from_string(const std::string& name);

/// Per-tensor dtype overrides by full tensor name (Accelerate's special_dtypes).
using SpecialDtypes = std::map<std::string, at::ScalarType>;

/// Bytes per module and tensor name, "" being the whole model, in insertion
/// order. A name with no entry has size 0 (Accelerate uses a defaultdict).
class ModuleSizes {
 public:
  /// The size of `name`, 0 when absent.
  double operator[](const std::string& name) const;
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  /// Adds `bytes` to `name`, creating the entry at the end when new.
  void add(const std::string& name, double bytes);
  const std::vector<std::pair<std::string, double>>& items() const { return items_; }
  size_t size() const { return items_.size(); }
  double total() const { return (*this)[""]; }

 private:
  std::vector<std::pair<std::string, double>> items_;
  std::unordered_map<std::string, size_t> index_;
};

/// Accelerate's compute_module_sizes. With `dtype`, floating tensors are
/// sized as min(dtype size, own size) (a dtype only ever shrinks them);
/// integer and bool tensors keep their size. `special_dtypes` entries win over
/// both. `buffers_only` counts buffers alone.
ModuleSizes compute_module_sizes(const torch::nn::Module& module,
                                 std::optional<at::ScalarType> dtype = std::nullopt,
                                 const SpecialDtypes& special_dtypes = {}, bool buffers_only = false);

/// Bytes of all buffers (non-persistent included) of `module`.
double compute_module_total_buffer_size(const torch::nn::Module& module,
                                        std::optional<at::ScalarType> dtype = std::nullopt,
                                        const SpecialDtypes& special_dtypes = {});

/// The class name used by no_split_module_classes: flex::Module::class_name(),
/// else libtorch's module name.
std::string module_class_name(const torch::nn::Module& module);

/// A named member of the planning queue: a module, or a single parameter or
/// buffer (then `module` is null and `tensor` is set).
struct NamedMember {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;
  at::Tensor tensor;
  bool is_module() const { return module != nullptr; }
};

/// The direct members of `module` in Accelerate's order: own parameters, then
/// children, then (with `with_buffers`) own buffers; names get `prefix`
/// ("" or "a.b"). Undefined tensors are skipped.
std::vector<NamedMember> direct_members(const torch::nn::Module& module, const std::string& prefix = "",
                                        bool with_buffers = true);

struct MaxLayer {
  double size = 0;
  std::vector<std::string> names;  // every layer at that size, in search order
};

/// Accelerate's get_max_layer_size: depth-first over `members`, a "layer" is a
/// tensor, a module without children, or a module whose class is in `no_split`.
MaxLayer get_max_layer_size(const std::vector<NamedMember>& members, const ModuleSizes& sizes,
                            const std::vector<std::string>& no_split);

struct MaximumSizes {
  double total = 0;
  MaxLayer largest_layer;
};

/// Accelerate's calculate_maximum_sizes: the f32-as-stored total and the
/// largest layer over the root's direct members (params, children, buffers).
MaximumSizes calculate_maximum_sizes(const torch::nn::Module& module,
                                     const std::vector<std::string>& no_split = {});

}  // namespace flex
