// Capture activations: wrap a model in FlexModel, hook every MLP by a hook
// group, run a few prompts, and save the captures as safetensors (readable
// from Python with safetensors.torch.load_file).
//
//   capture_activations [MODEL_DIR] [--work DIR] [--prompt TEXT]
#include "support/example_util.h"

#include <flex/dispatch/safetensors.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/auto_model.h>
#include <flex/models/generate.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <sstream>

int main(int argc, char** argv) {
  try {
    auto opt = flex_examples::parse_options(argc, argv, "capture_activations [MODEL_DIR] [--work DIR] [--prompt TEXT]");
    const std::string dir = flex_examples::model_dir_or_tiny(opt);
    auto model = flex::load_pretrained(dir);
    auto tok = flex::load_tokenizer(dir);

    flex::FlexModel fm(model);
    // One HookFunction per module whose name contains ".mlp", all in group "mlps"
    // (exact names avoid sub-modules such as ".mlp.c_fc").
    auto hooks = fm.create_hook_group("mlps", std::regex(R"(.*\.(mlp)$)"));
    fm.register_forward_hook(std::make_shared<flex::HookFunction>(flex_examples::final_norm_name(*model)));
    std::printf("hooked %zu MLPs and the final norm\n", hooks.size());

    const std::vector<std::string> prompts = {opt.prompt, "a dog ran in the park", "one two three four"};
    std::vector<std::vector<int64_t>> ids;
    for (const auto& p : prompts) ids.push_back(tok->encode(p));
    auto [input_ids, mask] = flex::pad_left(ids, tok->eos_id().value_or(0));
    {
      at::NoGradGuard ng;
      flex::LMInputs in;
      in.input_ids = input_ids;
      in.attention_mask = mask;
      fm.forward(in.to_inputs());
    }
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& [name, list] : fm.output()) {
      std::ostringstream shape;
      shape << list[0].sizes();
      std::printf("  %-32s %s\n", name.c_str(), shape.str().c_str());
      out.emplace_back(name, list[0]);
    }
    out.emplace_back("input_ids", input_ids);
    const std::string path = opt.work + "/activations.safetensors";
    flex::save_safetensors(path, out);
    std::printf("saved %zu tensors to %s\n", out.size(), path.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "capture_activations: error: %s\n", e.what());
    return 1;
  }
}
