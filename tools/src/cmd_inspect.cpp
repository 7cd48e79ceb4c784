// flexmodel inspect: the architecture, the module tree with parameter counts
// and bytes, tied parameters and the device map infer_auto_device_map
// chooses for a budget, computed on a meta model (no weights are read).
#include "cli.h"

#include <flex/models/from_pretrained.h>
#include <flex/models/gguf_model.h>
#include <flex/dispatch/gguf.h>
#include <flex/dispatch/auto_device_map.h>
#include <flex/dispatch/module_sizes.h>
#include <flex/dispatch/tied_parameters.h>
#include <flex/hooks/empty_init.h>
#include <flex/models/auto_model.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <unordered_set>

namespace flex::cli {

namespace {

const std::vector<Flag>& inspect_flags() {
  static const std::vector<Flag> flags = [] {
    std::vector<Flag> f = {
        {"--max-memory", "DEV=SIZE,...", "budget per device (0, 1, ..., cpu, disk); default: this machine's free memory"},
        {"--dtype", "f32|bf16|f16", "size floating weights as this dtype"},
        {"--quantize", "int8|nf4|fp4", "plan the dense layers quantized (bitsandbytes formats; lm_head stays)"},
        {"--no-split", "CLASS,...", "classes never split across devices ('none' for none; default: the block class)"},
        {"--json", "", "print one JSON object (architecture, num_parameters, module_sizes, tied_parameters, device_map)"},
        {"--log-level", "LEVEL", "error|warn|info|debug (default: $FLEXMODEL_LOG, else warn)"},
    };
    for (auto& p : parallel_flags()) f.push_back(p);
    return f;
  }();
  return flags;
}

int64_t count_parameters(const torch::nn::Module& m) {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : m.parameters(/*recurse=*/true))
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  return n;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ','))
    if (!part.empty()) out.push_back(part);
  return out;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  std::ostringstream os;
  os << std::fixed << std::setprecision(u == 0 ? 0 : 1) << b << " " << units[u];
  return os.str();
}

}  // namespace

int run_inspect(const std::vector<std::string>& argv) {
  Args args("inspect", inspect_flags(), argv);
  if (args.help()) {
    std::cout << usage_text("inspect", "MODEL_DIR [options]", inspect_flags(),
                            "Shows the architecture, the module tree with parameter counts and bytes, the tied\n"
                            "parameters and the device map infer_auto_device_map picks for the budget. The model\n"
                            "is built on the meta device from config.json: no weights are read.");
    return 0;
  }
  set_log_level(args.get("--log-level"));
  const std::string dir = args.one_positional("MODEL_DIR");
  // Under mpirun rank 0 reports (the plan of the mesh included); the others stop here.
  const Ranks ranks = parallel_setup(args);
  if (!ranks.writer()) return 0;
  InferDeviceMapOptions o;
  if (auto d = args.get("--dtype")) o.dtype = parse_dtype(*d);
  if (auto mm = args.get("--max-memory")) o.max_memory = parse_max_memory(*mm);
  require_model_dir(dir);

  // A GGUF file's config comes from its metadata.
  const ModelConfig cfg = is_gguf_file(dir) ? parse_config(gguf_config_json(*GgufFile::open(dir)), dir) : load_config(dir);
  std::shared_ptr<CausalLM> model;
  {
    // Parameters on meta; buffers real (they are tiny and sized as Accelerate sizes them).
    EmptyInit scope(/*include_buffers=*/false);
    model = build_causal_lm(cfg);
  }
  model->tie_weights();  // as from_pretrained does after init_empty_weights
  // Quantized layers (asked for, or as the checkpoint holds them) are sized as stored.
  if (!is_gguf_file(dir)) {
    plan_quantized_layers(*model, dir, quantization_option(args), o.dtype.value_or(at::kFloat));
  } else if (args.has("--quantize")) {
    throw UsageError("--quantize does not apply to a GGUF file yet");
  }

  if (auto ns = args.get("--no-split")) {
    o.no_split_module_classes = *ns == "none" ? std::vector<std::string>{} : split_commas(*ns);
  } else {
    o.no_split_module_classes = model->no_split_modules();
  }
  o.skip_module = [](const std::string& name) { return is_hook_point_name(name); };
  std::ostringstream warnings;
  o.log = &warnings;

  const ModuleSizes sizes = compute_module_sizes(*model, o.dtype);
  const auto tied = find_tied_parameters(*model);
  const DeviceMap map = infer_auto_device_map(*model, o);
  if (!warnings.str().empty() && log_level() >= LogLevel::Info) std::cerr << warnings.str();
  const int64_t nparams = count_parameters(*model);

  if (args.has("--json")) {
    nlohmann::ordered_json j;
    j["architecture"] = model->class_name();
    j["num_parameters"] = nparams;
    // Names are unique: appended without ordered_json's linear key search
    // (quadratic over DeepSeek-V3's ~150,000 modules).
    nlohmann::ordered_json ms = nlohmann::ordered_json::object();
    auto& entries = ms.get_ref<nlohmann::ordered_json::object_t&>();
    entries.reserve(sizes.items().size());
    for (const auto& [name, bytes] : sizes.items()) {
      if (bytes == static_cast<double>(static_cast<int64_t>(bytes))) entries.emplace_back(name, static_cast<int64_t>(bytes));
      else entries.emplace_back(name, bytes);
    }
    j["module_sizes"] = ms;
    j["tied_parameters"] = tied;
    j["device_map"] = nlohmann::ordered_json::parse(map.to_json());
    std::cout << j.dump() << "\n";
    return 0;
  }

  std::cout << "architecture: " << model->class_name() << " (" << cfg.model_type << ")\n"
            << "parameters:   " << nparams << " (" << human_bytes(sizes.total()) << " with buffers)\n"
            << "no-split:     ";
  for (size_t i = 0; i < o.no_split_module_classes.size(); ++i) std::cout << (i ? "," : "") << o.no_split_module_classes[i];
  std::cout << "\n\nmodules (name, class, parameters, bytes):\n";
  for (const auto& [name, m] : model->named_flex_modules()) {
    if (is_hook_point_name(name)) continue;
    const int depth = name.empty() ? 0 : 1 + static_cast<int>(std::count(name.begin(), name.end(), '.'));
    std::string label = name.empty() ? "(model)" : name.substr(name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1);
    std::cout << std::string(2 + 2 * depth, ' ') << label << "  " << m->class_name() << "  " << count_parameters(*m)
              << "  " << human_bytes(sizes[name]) << "\n";
  }
  std::cout << "\ntied parameters:";
  if (tied.empty()) std::cout << " none";
  for (const auto& g : tied) {
    std::cout << "\n ";
    for (const auto& n : g) std::cout << " " << n;
  }
  std::cout << "\n\ndevice map:\n" << map.to_json(2) << "\n";
  if (ranks.mesh) {
    const DeviceMesh& m = *ranks.mesh;
    const int64_t layers = cfg.num_hidden_layers, pp = m.pp_size(), tp = m.tp_size();
    std::cout << "\nparallel plan (" << m.describe() << "):\n";
    for (int64_t s = 0; s < pp; ++s) {
      // numpy.array_split, as the parallel model assigns blocks to stages
      const int64_t begin = s * (layers / pp) + std::min(s, layers % pp);
      const int64_t end = begin + layers / pp + (s < layers % pp ? 1 : 0);
      std::cout << "  stage " << s << ": blocks " << begin << ".." << end - 1 << (s == 0 ? ", embeddings" : "")
                << (s == pp - 1 ? ", final norm and head" : "") << "\n";
    }
    std::cout << "  each of the " << tp << " tp ranks of a stage holds " << cfg.num_attention_heads / tp << " of "
              << cfg.num_attention_heads << " attention heads and 1/" << tp << " of the MLP, embedding and head\n"
              << "  each of the " << m.dp_size() << " dp replicas runs its share of the batch\n";
  }
  return 0;
}

}  // namespace flex::cli
