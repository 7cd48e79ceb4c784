// The hook contract: a module name means what it means in Transformers 5.23,
// in every layout. This file runs the single-process layouts (in memory, and
// half of the model offloaded to disk); tests/parallel2/mpi_contract.cpp runs
// tp, pp and dp under mpirun. The comparison and the lists of deliberate and
// still-open differences are in contract_check.h.
#include <flex/dispatch/module_sizes.h>
#include <flex/models/causal_lm.h>
#include <flex/models/from_pretrained.h>

#include "contract_check.h"

namespace {

using namespace flex;
using contract_test::contract;

// One forward of the contract batch (left-padded) with every module hooked.
void run_case(const std::string& name, const nlohmann::json& info, std::shared_ptr<CausalLM> model,
              contract_test::Tally& tally) {
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
  contract_test::compare(name, info, *golden, fm.output(), hooked, tally);
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

}  // namespace
