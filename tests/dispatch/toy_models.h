#pragma once
// Accelerate's test models for device-map planning, as flex::Modules:
// ModelForTest = Linear(3, 4) + BatchNorm1d(4) + Linear(4, 5), 236 bytes in f32.
#include <flex/hooks/empty_init.h>
#include <flex/hooks/nn.h>

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flex_test {

/// PyTorch's BatchNorm1d: weight, bias, running_mean, running_var (f32) and
/// an int64 scalar num_batches_tracked, all persistent. Eval-mode forward.
class BatchNorm1d : public flex::Module {
 public:
  explicit BatchNorm1d(int64_t n) : Module("BatchNorm1d") {
    add_parameter("weight", weight, flex::new_parameter({n}));
    add_parameter("bias", bias, flex::new_parameter({n}));
    add_buffer("running_mean", running_mean, flex::new_buffer({n}));
    add_buffer("running_var", running_var, flex::new_buffer({n}));
    add_buffer("num_batches_tracked", num_batches_tracked, flex::new_buffer({}, at::TensorOptions().dtype(at::kLong)));
  }
  flex::Value forward(flex::Inputs inputs) override {
    at::Tensor x = inputs.args.at(0).toTensor();
    return (x - running_mean) / at::sqrt(running_var + 1e-5) * weight + bias;
  }
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};

class ModelForTest : public flex::Module {
 public:
  ModelForTest() : Module("ModelForTest") {
    linear1 = add("linear1", std::make_shared<flex::Linear>(3, 4));
    batchnorm = add("batchnorm", std::make_shared<BatchNorm1d>(4));
    linear2 = add("linear2", std::make_shared<flex::Linear>(4, 5));
  }
  flex::Value forward(flex::Inputs inputs) override {
    at::Tensor x = inputs.args.at(0).toTensor();
    return (*linear2)((*batchnorm)((*linear1)(x)));
  }
  std::shared_ptr<flex::Linear> linear1;
  std::shared_ptr<BatchNorm1d> batchnorm;
  std::shared_ptr<flex::Linear> linear2;
};

/// A container with named children (nn.Sequential(OrderedDict(...))).
class Named : public flex::Module {
 public:
  explicit Named(std::vector<std::pair<std::string, std::shared_ptr<flex::Module>>> children,
                 std::string class_name = "Sequential")
      : Module(std::move(class_name)) {
    for (auto& [name, m] : children) add(name, m);
  }
  flex::Value forward(flex::Inputs inputs) override { return inputs.args.at(0); }
};

/// nn.Sequential(ModelForTest(), ModelForTest(), ModelForTest()): children "0", "1", "2".
inline std::shared_ptr<flex::Sequential> three_models() {
  return std::make_shared<flex::Sequential>(std::vector<std::shared_ptr<flex::Module>>{
      std::make_shared<ModelForTest>(), std::make_shared<ModelForTest>(), std::make_shared<ModelForTest>()});
}

}  // namespace flex_test
