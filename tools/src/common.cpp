// Shared pieces of the flexmodel subcommands: logging, progress bars, option
// parsing (budgets, dtypes, sizes), checks on paths before any work starts,
// and model loading through from_pretrained.
#include "cli.h"

#include <flex/dispatch/module_sizes.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/gguf_model.h>

#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

namespace fs = std::filesystem;

namespace flex::cli {

// --- logging -----------------------------------------------------------------------
namespace {
LogLevel g_level = LogLevel::Warn;
int g_rank = 0;  // under mpirun only rank 0 logs (errors excepted) and draws progress

LogLevel level_from(const std::string& s, const std::string& source) {
  if (s == "error") return LogLevel::Error;
  if (s == "warn" || s == "warning") return LogLevel::Warn;
  if (s == "info") return LogLevel::Info;
  if (s == "debug") return LogLevel::Debug;
  throw UsageError(source + ": unknown log level '" + s + "' (use error, warn, info or debug)");
}
}  // namespace

void set_log_level(const std::optional<std::string>& flag) {
  if (flag) {
    g_level = level_from(*flag, "--log-level");
  } else if (const char* env = std::getenv("FLEXMODEL_LOG"); env && *env) {
    g_level = level_from(env, "FLEXMODEL_LOG");
  }
}

LogLevel log_level() { return g_level; }

void log(LogLevel level, const std::string& message) {
  if (level > g_level || (g_rank != 0 && level > LogLevel::Error)) return;
  static const char* names[] = {"error", "warning", "info", "debug"};
  std::cerr << "flexmodel: " << names[static_cast<int>(level)] << ": " << message << "\n";
}

// --- progress ----------------------------------------------------------------------
namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::string duration_text(double s) {
  const long long t = static_cast<long long>(s + 0.5);
  char buf[48];
  if (t >= 3600) std::snprintf(buf, sizeof(buf), "%lldh%02lldm", t / 3600, t / 60 % 60);
  else if (t >= 60) std::snprintf(buf, sizeof(buf), "%lldm%02llds", t / 60, t % 60);
  else std::snprintf(buf, sizeof(buf), "%llds", t);
  return buf;
}
}  // namespace

Progress::Progress(std::string what, int64_t total, std::string unit)
    : what_(std::move(what)), unit_(std::move(unit)), total_(total),
      on_(g_rank == 0 && isatty(STDERR_FILENO) && g_level >= LogLevel::Warn),
      lines_(g_rank == 0 && !on_ && !unit_.empty() && g_level >= LogLevel::Warn),
      started_(now_seconds()), last_line_(started_) {
  if (on_) draw();
}

Progress::~Progress() {
  if (on_) std::cerr << "\n";
}

void Progress::step(int64_t n) {
  done_ += n;
  fraction_ = total_ > 0 ? double(done_) / double(total_) : 0;
  draw();
}

void Progress::set(int64_t done, double fraction) {
  if (start_done_ < 0) {  // the first report: a resumed run measures its rate from here
    start_done_ = done_;
    start_fraction_ = fraction_;
  }
  done_ = done;
  fraction_ = std::clamp(fraction, 0.0, 1.0);
  draw();
}

std::string Progress::text() const {
  std::ostringstream os;
  const int width = 30;
  const int64_t filled = static_cast<int64_t>(fraction_ * width);
  os << what_ << " [" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << done_;
  if (total_ > 0) os << "/" << total_;
  if (!unit_.empty()) {
    os << " " << unit_;
    const double elapsed = now_seconds() - started_;
    const int64_t base = std::max<int64_t>(start_done_, 0);
    if (elapsed > 0.5 && done_ > base) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), ", %.0f %s/s", double(done_ - base) / elapsed, unit_.c_str());
      os << buf;
      const double progressed = fraction_ - start_fraction_;
      if (progressed > 0 && fraction_ < 1) os << ", ETA " << duration_text(elapsed * (1 - fraction_) / progressed);
    }
  }
  return os.str();
}

void Progress::draw() {
  if (on_) {
    std::cerr << "\r" << text() << "\033[K" << std::flush;
  } else if (lines_ && now_seconds() - last_line_ >= 10) {
    last_line_ = now_seconds();
    const std::string line = "flexmodel: " + text() + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
}

// --- parsing -----------------------------------------------------------------------
int64_t parse_size(const std::string& flag, const std::string& text) {
  try {
    return convert_file_size_to_int(text);
  } catch (const flex::Error&) {
    throw UsageError("option " + flag + ": bad size '" + text + "' (use bytes or a size such as 200MB, 1.5GB, 512KiB, 1GiB)");
  }
}

MaxMemory parse_max_memory(const std::string& text) {
  MaxMemory mm;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty()) continue;
    const auto eq = part.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == part.size())
      throw UsageError("option --max-memory: '" + part + "' is not DEVICE=SIZE (e.g. 0=200MB,cpu=1GiB,disk=10GB)");
    const std::string key = part.substr(0, eq), size = part.substr(eq + 1);
    const int64_t bytes = parse_size("--max-memory", size);
    try {
      mm.set(MapDevice(key), static_cast<double>(bytes));
    } catch (const flex::Error&) {
      throw UsageError("option --max-memory: unknown device '" + key + "' (use 0, 1, ..., cpu or disk)");
    }
  }
  if (mm.empty()) throw UsageError("option --max-memory: no budget given (e.g. 0=200MB,cpu=1GiB)");
  return mm;
}

at::ScalarType parse_dtype(const std::string& given) {
  // Transformers' spelling ("torch.float16") is accepted too.
  const std::string text = given.rfind("torch.", 0) == 0 ? given.substr(6) : given;
  if (text == "f32" || text == "float32" || text == "fp32" || text == "float") return at::kFloat;
  if (text == "bf16" || text == "bfloat16") return at::kBFloat16;
  if (text == "f16" || text == "float16" || text == "fp16" || text == "half") return at::kHalf;
  throw UsageError("option --dtype: unknown dtype '" + given + "' (use f32, bf16 or f16)");
}

std::string torch_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kDouble: return "float64";
    default: return "float32";
  }
}

// --- paths -------------------------------------------------------------------------
void require_model_dir(const std::string& dir) {
  if (is_gguf_file(dir)) return;  // a GGUF file holds the config and the weights
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw IOError("model directory '" + dir + "' does not exist");
  if (!fs::is_directory(dir, ec)) throw IOError("'" + dir + "' is not a directory (expected a model folder with config.json)");
  if (!fs::exists(fs::path(dir) / "config.json", ec))
    throw IOError("'" + dir + "' is not a model directory: it has no config.json");
}

void require_writable_file(const std::string& path) {
  fs::path p(path);
  fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (fs::is_directory(p, ec)) throw IOError("cannot write '" + path + "': it is a directory");
  if (!fs::is_directory(parent, ec)) throw IOError("cannot write '" + path + "': folder '" + parent.string() + "' does not exist");
  if (access(parent.c_str(), W_OK) != 0) throw IOError("cannot write '" + path + "': folder '" + parent.string() + "' is not writable");
}

void require_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw IOError("cannot create folder '" + dir + "': " + (ec ? ec.message() : "not a directory"));
  if (access(dir.c_str(), W_OK) != 0) throw IOError("cannot write into folder '" + dir + "'");
}

// --- loading -----------------------------------------------------------------------
std::vector<Flag> loading_flags() {
  return {
      {"--device-map", "auto|sequential|FILE.json", "where modules run: a strategy or a hf_device_map JSON file"},
      {"--max-memory", "DEV=SIZE,...", "budgets for --device-map, e.g. 0=200MB,cpu=1GiB (implies --device-map auto)"},
      {"--offload-folder", "DIR", "folder for weights the map sends to disk"},
      {"--prefetch-depth", "N", "offloaded blocks read ahead while the previous one computes (default 1; 0: off)"},
      {"--dtype", "f32|bf16|f16", "model and output dtype (default f32)"},
      {"--quantize", "int8|nf4|fp4", "quantize the dense layers while loading (bitsandbytes formats; lm_head stays)"},
      {"--quantize-head", "none|int8|nf4|q8_0|q6_k",
       "quantize the output head at load (default none; the error it adds is in docs/gguf.md)"},
      {"--quantize-embeddings", "none|int8|nf4|q8_0|q6_k",
       "store the input token embedding quantized, dequantizing only the rows looked up (default none; "
       "docs/gguf.md)"},
      {"--no-mmap", "", "copy the weights into memory instead of mapping the checkpoint (faster decoding)"},
      {"--fast-activations", "",
       "GGUF files: quantized layers take their inputs as 8 bits per 32 values with integer dot products, as "
       "llama.cpp does (faster decoding; error in docs/gguf.md)"},
  };
}

std::optional<BnbQuantizationConfig> quantization_option(const Args& args) {
  auto q = args.get("--quantize");
  if (!q) return std::nullopt;
  if (*q != "int8" && *q != "nf4" && *q != "fp4")
    throw UsageError("option --quantize must be int8, nf4 or fp4, got '" + *q + "'");
  // 4-bit layers compute in the model's dtype (--dtype), as bnb_4bit_compute_dtype.
  const at::ScalarType compute = args.get("--dtype") ? parse_dtype(*args.get("--dtype")) : at::kFloat;
  return quantization_from_string(*q, compute);
}

std::shared_ptr<CausalLM> load_model(const std::string& dir, const Args& args) {
  require_model_dir(dir);
  PretrainedOptions o;
  if (auto d = args.get("--dtype")) o.torch_dtype = torch_dtype_name(parse_dtype(*d));
  o.quantization = quantization_option(args);
  if (auto h = args.get("--quantize-head")) {
    if (*h != "none" && *h != "int8" && *h != "nf4" && *h != "q8_0" && *h != "q6_k")
      throw UsageError("option --quantize-head must be none, int8, nf4, q8_0 or q6_k, got '" + *h + "'");
    o.quantize_head = *h;
  }
  if (auto e = args.get("--quantize-embeddings")) {
    if (*e != "none" && *e != "int8" && *e != "nf4" && *e != "q8_0" && *e != "q6_k")
      throw UsageError("option --quantize-embeddings must be none, int8, nf4, q8_0 or q6_k, got '" + *e + "'");
    o.quantize_embeddings = *e;
  }
  o.mmap = !args.has("--no-mmap");
  o.fast_activations = args.has("--fast-activations");
  if (o.fast_activations && !is_gguf_file(dir))
    throw UsageError("--fast-activations applies to GGUF files (their quantized layers); '" + dir + "' is not one");
  if (auto mm = args.get("--max-memory")) o.max_memory = parse_max_memory(*mm);
  if (auto pf = args.get_int("--prefetch-depth")) {
    if (*pf < 0 || *pf > 64) throw UsageError("option --prefetch-depth must be 0 (off) to 64, got " + std::to_string(*pf));
    o.prefetch_depth = static_cast<int>(*pf);
  }
  if (auto off = args.get("--offload-folder")) {
    require_writable_dir(*off);
    o.offload_folder = *off;
  }
  if (auto dm = args.get("--device-map")) {
    static const std::vector<std::string> strategies = {"auto", "balanced", "balanced_low_0", "sequential", "cpu", "disk"};
    bool is_strategy = false;
    for (const auto& s : strategies) is_strategy = is_strategy || *dm == s;
    if (is_strategy) {
      o.device_map_strategy = *dm;
    } else if (fs::exists(*dm) || (dm->size() > 5 && dm->substr(dm->size() - 5) == ".json")) {
      o.device_map = DeviceMap::load(*dm);  // IOError / FileFormatError / DeviceMapError name the file
    } else {
      throw UsageError("option --device-map: '" + *dm +
                       "' is neither auto, balanced, balanced_low_0, sequential, cpu, disk nor a .json file");
    }
  } else if (o.max_memory) {
    o.device_map_strategy = "auto";
  }
  if (log_level() >= LogLevel::Debug) o.log = &std::cerr;
  log(LogLevel::Info, "loading " + dir);
  Progress p("loading", 1);
  auto model = from_pretrained(dir, o);
  p.step();
  return model;
}

// --- parallel ----------------------------------------------------------------------
std::vector<Flag> parallel_flags() {
  return {{"--tp", "N", "tensor-parallel ranks (default 1)"},
          {"--pp", "N", "pipeline-parallel ranks (default 1)"},
          {"--dp", "N", "data-parallel ranks (default 1)"},
          {"--expert-parallel", "", "mixture-of-experts models: whole experts per --tp rank instead of a slice of each"}};
}

Ranks parallel_setup(const Args& args) {
  int64_t v[3];
  const char* names[3] = {"--tp", "--pp", "--dp"};
  int64_t product = 1;
  for (int i = 0; i < 3; ++i) {
    v[i] = args.get_int(names[i]).value_or(1);
    if (v[i] < 1) throw UsageError(std::string("option ") + names[i] + " must be at least 1, got " + std::to_string(v[i]));
    product *= v[i];
  }
  Ranks r;
  r.world = make_world_communicator();  // MPI under mpirun, else one local rank
  const int n = r.world->size();
  g_rank = r.world->rank();
  if (product != n) {
    throw UsageError("--tp " + std::to_string(v[0]) + " x --pp " + std::to_string(v[1]) + " x --dp " + std::to_string(v[2]) +
                     " = " + std::to_string(product) + " rank(s), but this job has " + std::to_string(n) +
                     (n == 1 ? " (run it under mpirun -np " + std::to_string(product) + ")" : " (mpirun -np)"));
  }
  if (product > 1) {
    r.mesh = std::make_shared<DeviceMesh>(r.world, static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]));
  }
  return r;
}

std::shared_ptr<ParallelCausalLM> load_parallel_model(const std::string& dir, const Args& args, const DeviceMesh& mesh) {
  for (const char* f : {"--device-map", "--max-memory", "--offload-folder", "--prefetch-depth"})
    if (args.has(f))
      throw UsageError(std::string("option ") + f +
                       " cannot be combined with --tp/--pp/--dp: each rank keeps its slices of the model in memory");
  require_model_dir(dir);
  ParallelLMOptions o;
  if (auto d = args.get("--dtype")) o.dtype = parse_dtype(*d);
  o.quantization = quantization_option(args);
  o.expert_parallel = args.has("--expert-parallel");
  log(LogLevel::Info, "loading " + dir + " over " + mesh.describe() + (o.expert_parallel ? " (experts whole per tp rank)" : ""));
  Progress p("loading", 1);
  auto model = load_parallel_pretrained(dir, mesh, o);
  p.step();
  return model;
}

std::vector<std::string> all_hook_names(Module& model) {
  std::vector<std::string> names;
  for (const auto& nm : model.named_flex_modules())
    if (!nm.first.empty() && !is_hook_point_name(nm.first)) names.push_back(nm.first);
  return names;
}

std::vector<std::string> matching_hook_names(Module& model, const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  std::vector<std::string> names;
  for (const auto& nm : model.named_flex_modules())
    if (!nm.first.empty() && fnmatch(pattern.c_str(), nm.first.c_str(), 0) == 0) names.push_back(nm.first);
  if (names.empty()) throw NotFoundError("--hook '" + pattern + "' matches no module of the model");
  return names;
}

InputBatch read_input_ids(const std::string& path) {
  auto f = SafetensorsFile::open(path);
  if (!f->contains("input_ids")) {
    std::string names;
    for (const auto& n : f->names()) names += (names.empty() ? "" : ", ") + n;
    throw NotFoundError("'" + path + "' has no tensor named input_ids (it has: " + names + ")");
  }
  InputBatch b;
  b.input_ids = f->get("input_ids").to(at::kLong).clone();
  if (b.input_ids.dim() == 1) b.input_ids = b.input_ids.unsqueeze(0);
  if (b.input_ids.dim() != 2)
    throw ShapeError("'" + path + "': input_ids must be [batch, tokens], got " + std::to_string(b.input_ids.dim()) + " dims");
  if (f->contains("attention_mask")) {
    b.attention_mask = f->get("attention_mask").to(at::kLong).clone();
    if (b.attention_mask.dim() == 1) b.attention_mask = b.attention_mask.unsqueeze(0);
    if (b.attention_mask.sizes() != b.input_ids.sizes())
      throw ShapeError("'" + path + "': attention_mask shape does not match input_ids");
  }
  return b;
}


int64_t int_at_least(const Args& args, const std::string& flag, int64_t fallback, int64_t min) {
  const int64_t v = args.get_int(flag).value_or(fallback);
  if (v < min)
    throw UsageError("option " + flag + (min == 1 ? std::string(" must be at least 1") : " must be >= " + std::to_string(min)));
  return v;
}

std::vector<int64_t> parse_index_list(const std::string& flag, const std::string& text, const std::string& what) {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 0) throw UsageError("option " + flag + ": '" + item + "' is not " + what);
    ids.push_back(v);
    start = comma + 1;
  }
  return ids;
}

// --- HTML pages ---------------------------------------------------------------------
std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string visible_token(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ' ') out += "\xE2\x90\xA3";        // U+2423 open box
    else if (c == '\n') out += "\xE2\x86\xB5";  // U+21B5
    else if (static_cast<unsigned char>(c) < 0x20) out += "\xEF\xBF\xBD";
    else out += c;
  }
  return out;
}

}  // namespace flex::cli
