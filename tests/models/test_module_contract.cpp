// The hook contract: a module name means what it means in Transformers 5.23,
// in every layout. This file runs the single-process layouts (in memory, and
// half of the model offloaded to disk); tests/parallel2/mpi_contract.cpp runs
// tp, pp and dp under mpirun. The comparison and the lists of deliberate and
// still-open differences are in contract_check.h.
#include <flex/dispatch/module_sizes.h>
#include <flex/models/causal_lm.h>
#include <flex/models/from_pretrained.h>
#include <flex/quant/bnb_config.h>

#include "contract_check.h"

namespace {

using namespace flex;
using contract_test::contract;

// One forward of the contract batch (left-padded) with every module hooked.
void run_case(const std::string& name, const nlohmann::json& info, std::shared_ptr<CausalLM> model,
              contract_test::Tally& tally, double atol = 1e-5, double rtol = 1e-4) {
  auto golden = SafetensorsFile::open(contract(name + ".contract.safetensors"));
  FlexModel fm(model);
  const auto hooked = contract_test::hook_every_module(fm, name, info, tally);
  {
    at::NoGradGuard g;
    LMInputs in;
    in.input_ids = golden->get("input_ids");
    in.attention_mask = golden->get("attention_mask");
    fm.forward(in.to_inputs());
  }
  // Captures come back in the model's dtype: compared in float.
  for (auto& [key, calls] : fm.output())
    for (auto& t : calls)
      if (at::isFloatingType(t.scalar_type())) t = t.to(at::kFloat);
  contract_test::compare(name, info, *golden, fm.output(), hooked, tally, atol, rtol);
}

TEST(ModuleContract, InMemory) {
  contract_test::Tally tally;
  const auto m = contract_test::manifest();
  const auto& cases = m["cases"];
  for (auto& [name, info] : cases.items()) run_case(name, info, from_pretrained(contract(name)), tally);
  contract_test::expect_only_open_differences(tally, "in memory");
  EXPECT_GT(tally.compared, 900);
}

// Half of each model's weights on disk (Accelerate's "auto" map under a CPU
// budget of half the model): the offload hooks load each block's weights
// around its forward, and the hooks see what they see in memory.
TEST(ModuleContract, HalfOffloadedToDisk) {
  contract_test::Tally tally;
  const auto m = contract_test::manifest();
  const auto& cases = m["cases"];
  for (auto& [name, info] : cases.items()) {
    flex_test::TempDir folder;
    PretrainedOptions o;
    o.device_map_strategy = "auto";
    MaxMemory mm;
    mm.set(MapDevice::cpu(), 0.5 * compute_module_sizes(*from_pretrained(contract(name))).total());
    o.max_memory = mm;
    o.offload_folder = folder.str();
    auto model = from_pretrained(contract(name), o);
    bool disk = false;
    if (auto map = hf_device_map(*model))
      for (const auto& e : *map) disk = disk || e.second.is_disk();
    EXPECT_TRUE(disk) << name << ": nothing was offloaded to disk";
    run_case(name, info, model, tally);
  }
  contract_test::expect_only_open_differences(tally, "half on disk");
  EXPECT_GT(tally.compared, 900);
}

// The same model in bfloat16 and with int8 (LLM.int8()) weights: every hook
// point keeps Transformers' shape and layout (checked exactly). Values are
// float32 Transformers' within what those formats change, bounded at 0.4 of
// each output's largest magnitude: measured worst 0.22 (bf16) and 0.32 (int8),
// where a rounded router logit sends a token to another expert (Qwen3-MoE,
// DeepSeek-V3, gpt-oss) and what follows differs by that expert's output.
TEST(ModuleContract, Bfloat16AndInt8) {
  const auto m = contract_test::manifest();
  const auto& cases = m["cases"];
  for (const auto& [what, rtol] : std::vector<std::pair<std::string, double>>{{"bfloat16", 0.4}, {"int8", 0.4}}) {
    contract_test::Tally tally;
    for (auto& [name, info] : cases.items()) {
      PretrainedOptions o;
      if (what == "bfloat16") o.torch_dtype = "bfloat16";
      else o.quantization = quantization_from_string("int8");
      run_case(name, info, from_pretrained(contract(name), o), tally, 1e-3, rtol);
    }
    contract_test::expect_only_open_differences(tally, what);
    EXPECT_GT(tally.compared, 1900) << what;
  }
}

}  // namespace
