// Offload a model that does not fit the budget: plan a device map with a CPU
// budget smaller than the model (the rest goes to disk), load it with
// from_pretrained, and check that the offloaded model computes what the
// in-memory one does, capturing a disk-resident block through FlexModel.
//
//   offload_big_model [MODEL_DIR] [--work DIR] [--small]
#include "support/example_util.h"

#include <flex/dispatch/big_modeling.h>
#include <flex/dispatch/module_sizes.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/from_pretrained.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(argc, argv, "offload_big_model [MODEL_DIR] [--work DIR] [--small]");
    const std::string dir = flex_examples::model_dir_or_tiny(opt, opt.small ? 4 : 8);
    auto now = [] { return std::chrono::steady_clock::now(); };
    auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };

    auto t0 = now();
    auto full = flex::from_pretrained(dir);
    auto t1 = now();
    const double total = flex::compute_module_sizes(*full).total();

    flex::PretrainedOptions o;
    o.device_map_strategy = "auto";
    flex::MaxMemory mm;
    mm.set(flex::MapDevice::cpu(), 0.4 * total);  // 40% of the model in RAM, the rest on disk
    o.max_memory = mm;
    o.offload_folder = opt.work + "/offload";
    auto t2 = now();
    auto offloaded = flex::from_pretrained(dir, o);
    auto t3 = now();
    const auto map = *flex::hf_device_map(*offloaded);
    std::printf("model: %.0f bytes; CPU budget %.0f bytes\ndevice map: %s\n", total, 0.4 * total, map.to_json().c_str());

    std::string disk_block;
    for (int i = 0; i < offloaded->config().num_hidden_layers && disk_block.empty(); ++i) {
      auto dev = map.device_of(flex_examples::block_name(*offloaded, i));
      if (dev && dev->is_disk()) disk_block = flex_examples::block_name(*offloaded, i);
    }
    at::Tensor ids = at::arange(0, 16, at::kLong).unsqueeze(0);
    at::NoGradGuard ng;
    flex::FlexModel fm_full(full), fm_off(offloaded);
    if (!disk_block.empty()) {
      fm_full.register_forward_hook(std::make_shared<flex::HookFunction>(disk_block));
      fm_off.register_forward_hook(std::make_shared<flex::HookFunction>(disk_block));
    }
    auto t4 = now();
    at::Tensor a = fm_full.forward(ids);
    auto t5 = now();
    at::Tensor b = fm_off.forward(ids);
    auto t6 = now();
    std::printf("load: in memory %.1f ms, offloaded %.1f ms; forward: in memory %.1f ms, offloaded %.1f ms\n", ms(t0, t1),
                ms(t2, t3), ms(t4, t5), ms(t5, t6));
    // BLAS kernels may sum in a different order for weights at a different
    // address alignment (mmapped checkpoint vs page-aligned offload file), so
    // "the same" means equal up to float rounding, not bitwise.
    auto close = [](const at::Tensor& x, const at::Tensor& y, double* diff) {
      *diff = (x - y).abs().max().item<double>();
      return *diff <= 1e-5 * std::max(1.0, x.abs().max().item<double>());
    };
    double dl = 0;
    bool ok = close(a, b, &dl);
    std::printf("max |logits difference|: %g\n", dl);
    if (!disk_block.empty()) {
      double d = 0;
      const bool same = close(fm_full.output().at(disk_block)[0], fm_off.output().at(disk_block)[0], &d);
      std::printf("captured %s (weights on disk): max |difference| %g (%s)\n", disk_block.c_str(), d,
                  same ? "same up to float rounding" : "DIFFERENT");
      ok = ok && same;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload_big_model: error: %s\n", e.what());
    return 1;
  }
}
