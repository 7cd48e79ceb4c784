// flexmodel convert: re-shard a checkpoint, change its dtype, or write it as
// an Accelerate offload folder; config.json (dtype updated), the generation
// config and the tokenizer files are copied along.
#include "cli.h"

#include <flex/models/from_pretrained.h>
#include <flex/models/gguf_model.h>
#include <flex/dispatch/gguf.h>
#include <flex/models/model_checkpoint.h>
#include <flex/quant/quantize_model.h>
#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/checkpoint.h>
#include <flex/dispatch/offload_folder.h>
#include <flex/dispatch/sharded_writer.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>

namespace fs = std::filesystem;

namespace flex::cli {

namespace {

const std::vector<Flag>& convert_flags() {
  static const std::vector<Flag> flags = [] {
    std::vector<Flag> f = {
        {"--out", "DIR", "output folder (created)"},
        {"--max-shard-size", "SIZE", "largest shard, e.g. 200MB or 5GB (default: 5GB, Transformers' default)"},
        {"--dtype", "f32|bf16|f16", "cast floating tensors"},
        {"--quantize", "int8|nf4|fp4", "write the dense layers quantized, in bitsandbytes' layout (lm_head stays)"},
        {"--offload-folder", "", "write an Accelerate offload folder (index.json + NAME.dat) instead of safetensors"},
        {"--log-level", "LEVEL", "error|warn|info|debug (default: $FLEXMODEL_LOG, else warn)"},
    };
    for (auto& p : parallel_flags()) f.push_back(p);
    return f;
  }();
  return flags;
}

}  // namespace

int run_convert(const std::vector<std::string>& argv) {
  Args args("convert", convert_flags(), argv);
  if (args.help()) {
    std::cout << usage_text("convert", "MODEL_DIR|FILE.gguf --out DIR [--max-shard-size SIZE] [--dtype ...] [--offload-folder]",
                            convert_flags(),
                            "Rewrites a checkpoint: re-sharded safetensors (model.safetensors, or\n"
                            "model-0000i-of-0000n.safetensors + model.safetensors.index.json), optionally cast to\n"
                            "another dtype, or an Accelerate offload folder. Tensor names are kept as stored.\n"
                            "A GGUF file is written as the Transformers folder it describes (config.json from its\n"
                            "metadata, tensors dequantized to float32 under Transformers' names).");
    return 0;
  }
  set_log_level(args.get("--log-level"));
  const std::string dir = args.one_positional("MODEL_DIR");
  // Under mpirun rank 0 converts; the others have nothing to write.
  if (!parallel_setup(args).writer()) return 0;
  const auto out = args.get("--out");
  if (!out) throw UsageError("missing --out DIR");
  const uint64_t shard = static_cast<uint64_t>(parse_size("--max-shard-size", args.get("--max-shard-size").value_or("5GB")));
  if (shard == 0) throw UsageError("option --max-shard-size must be more than 0 bytes");
  std::optional<at::ScalarType> dtype;
  if (auto d = args.get("--dtype")) dtype = parse_dtype(*d);
  const bool offload = args.has("--offload-folder");
  if (offload && args.has("--max-shard-size")) throw UsageError("--max-shard-size does not apply to --offload-folder");
  require_model_dir(dir);
  std::error_code ec;
  if (fs::exists(*out) && fs::equivalent(dir, *out, ec))
    throw UsageError("--out must differ from MODEL_DIR");
  require_writable_dir(*out);

  if (is_gguf_file(dir)) {
    // A GGUF file: written as the Transformers folder it describes (config.json
    // from its metadata, tensors dequantized under Transformers' names).
    if (args.has("--quantize")) throw UsageError("--quantize does not apply to a GGUF file yet");
    auto gguf = GgufFile::open(dir);
    nlohmann::json cfg = gguf_config_json(*gguf);
    std::vector<std::pair<std::string, at::Tensor>> tensors = gguf_state_dict(*gguf);
    if (dtype) {
      for (auto& [name, t] : tensors) t = t.to(*dtype);
      cfg["torch_dtype"] = torch_dtype_name(*dtype);
    }
    Progress progress("writing", 1);
    if (offload) {
      offload_state_dict(*out, tensors);
    } else {
      save_sharded_safetensors(*out, tensors, shard);
    }
    progress.step();
    write_file_atomic((fs::path(*out) / "config.json").string(), cfg.dump(2) + "\n");
    if (log_level() >= LogLevel::Warn)
      std::cerr << "flexmodel: wrote " << tensors.size() << " tensors and config.json from GGUF file " << dir << " to "
                << *out << "\n";
    return 0;
  }

  // The model's view of the checkpoint (renamed, dropped, FP8 / MXFP4
  // dequantized) where the written folder is the model as loaded: when
  // quantizing, and when the stored format is one only loading undoes.
  const ModelConfig model_cfg = load_config(dir);
  const bool dequantize = dequantized_at_load(model_cfg);
  const Checkpoint ckpt = Checkpoint::open(dir);
  const Checkpoint viewed = ckpt.with_view(model_checkpoint_view(model_cfg, ckpt));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const auto quantization = quantization_option(args);
  std::shared_ptr<CausalLM> quantized;
  if (quantization) {
    // Loaded quantized (tensor by tensor), written under bitsandbytes' names:
    // the checkpoint's own tensors and each quantized layer's new ones.
    PretrainedOptions po;
    po.quantization = quantization;
    if (dtype) po.torch_dtype = torch_dtype_name(*dtype);
    quantized = from_pretrained(dir, po);
    auto ends_with = [](const std::string& s, const std::string& tail) {
      return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (auto& [name, t] : bnb_state_dict(*quantized)) {
      // A quantized layer's own tensors: weight.absmax, ..., SCB, weight_format.
      const bool extra = name.find(".weight.") != std::string::npos || ends_with(name, ".SCB") ||
                         ends_with(name, ".weight_format");
      if (viewed.contains(name) || extra) tensors.emplace_back(name, t);
    }
  } else {
    const Checkpoint& source = dequantize ? viewed : ckpt;
    for (const auto& file : source.files())
      for (const auto& key : source.keys_in(file)) {
        at::Tensor t = source.get(key);
        if (dtype && t.is_floating_point()) t = t.to(*dtype);
        tensors.emplace_back(key, t);
      }
  }
  Progress progress("writing", 1);
  if (offload) {
    offload_state_dict(*out, tensors);
  } else {
    save_sharded_safetensors(*out, tensors, shard);
  }
  progress.step();

  // config.json with the new torch_dtype; the other model-folder files as they are.
  std::ifstream cin(fs::path(dir) / "config.json");
  nlohmann::ordered_json cfg;
  try {
    cfg = nlohmann::ordered_json::parse(cin);
  } catch (const std::exception& e) {
    throw FileFormatError("'" + (fs::path(dir) / "config.json").string() + "' is not valid JSON: " + e.what());
  }
  if (dtype) cfg["torch_dtype"] = torch_dtype_name(*dtype);
  if (dequantize) cfg.erase("quantization_config");  // written dequantized (replaced below when quantizing)
  if (quantization)
    cfg["quantization_config"] = nlohmann::ordered_json::parse(bnb_quantization_config_json(*quantization).dump());
  // Every file goes through AtomicFile (temp name, fsync, rename): a failure
  // leaves no half-written file and raises IOError naming it.
  write_file_atomic((fs::path(*out) / "config.json").string(), cfg.dump(2) + "\n");
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "vocab.json", "merges.txt", "tokenizer.model"})
    if (fs::exists(fs::path(dir) / name))
      write_file_atomic((fs::path(*out) / name).string(), read_file((fs::path(dir) / name).string()));
  if (log_level() >= LogLevel::Warn)
    std::cerr << "flexmodel: wrote " << tensors.size() << " tensors to " << *out << (offload ? " (offload folder)" : "") << "\n";
  return 0;
}

}  // namespace flex::cli
