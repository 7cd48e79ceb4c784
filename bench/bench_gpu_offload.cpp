// Offloaded generation on a GPU, our side of scripts/gpu/bench.sh (which runs
// Hugging Face Transformers + Accelerate on the same model and device map):
// loads a Hugging Face folder with the hf_device_map Accelerate chose
// (blocks on the GPU, the CPU and disk), generates greedily from a prompt of
// --prompt-len token ids and reports the prompt latency (time to the first
// token: generate() called until the first step's logits are ready) and the
// decode speed ((new tokens - 1) / time from the first to the last step's
// logits). With --capture N each timed run is paired with one through a
// FlexModel capturing model.layers.{0..N-1}.mlp (captures checked to arrive
// on the CPU, one per step and module). One JSON line per run on stdout.
// Measured in the same run, before loading: the host-to-device bandwidth from
// pinned memory (CUDA) and the read rate of the files the disk blocks come
// from (cold after dropping their cached pages, and warm); each run reports
// its decode as a fraction of the transfer bound those give
// (decode_of_bound), and the block prefetcher's statistics
// (prefetch_applied: blocks were read ahead).
//
//   bench_gpu_offload --model DIR --device-map MAP.json [--config NAME]
//       [--offload-folder DIR] [--prompt-len 512] [--new-tokens 64]
//       [--repeats 2] [--warmup-tokens 16] [--capture N] [--prefetch-depth D]
//       [--dtype bfloat16] [--threads T] [--graph-modes 1]
//   bench_gpu_offload --write-tiny-llama DIR   (a 2-layer float32 Llama for smoke tests)
//
// Works without CUDA too (everything then runs on the CPU; no GPU syncs).
#include "bench_util.h"

#include <flex/dispatch/block_prefetch.h>
#include <flex/dispatch/device_map.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/generate.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <utility>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string model, device_map, offload_folder, config = "unnamed", dtype = "bfloat16";
  int64_t prompt_len = 512, new_tokens = 64, warmup_tokens = 16;  // as bench_accelerate.py (its note on 4)
  int repeats = 2, capture = 0, prefetch = -1, threads = 0;
  bool graph_modes = false;  // --graph-modes 1: the decode-mode rows (design decision 51) instead
};

[[noreturn]] void usage(const char* argv0, const std::string& why) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s --model DIR --device-map MAP.json [--config NAME] [--offload-folder DIR]\n"
               "  [--prompt-len 512] [--new-tokens 64] [--repeats 2] [--warmup-tokens 16] [--capture N] [--graph-modes 1]\n"
               "  [--prefetch-depth D] [--dtype bfloat16] [--threads T]\n"
               "  or: %s --write-tiny-llama DIR\n",
               argv0, why.c_str(), argv0, argv0);
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(argv[0], "missing value after " + k);
    const std::string v = argv[++i];
    if (k == "--model") a.model = v;
    else if (k == "--device-map") a.device_map = v;
    else if (k == "--offload-folder") a.offload_folder = v;
    else if (k == "--config") a.config = v;
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--prompt-len") a.prompt_len = std::stoll(v);
    else if (k == "--new-tokens") a.new_tokens = std::stoll(v);
    else if (k == "--warmup-tokens") a.warmup_tokens = std::stoll(v);
    else if (k == "--repeats") a.repeats = std::stoi(v);
    else if (k == "--capture") a.capture = std::stoi(v);
    else if (k == "--prefetch-depth") a.prefetch = std::stoi(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--graph-modes") a.graph_modes = v == "1";
    else usage(argv[0], "unknown option " + k);
  }
  if (a.model.empty() || a.device_map.empty()) usage(argv[0], "--model and --device-map are required");
  if (a.prompt_len < 1 || a.new_tokens < 2 || a.repeats < 1 || a.capture < 0 || a.warmup_tokens < 1)
    usage(argv[0], "need prompt-len >= 1, new-tokens >= 2, repeats >= 1, warmup-tokens >= 1, capture >= 0");
  return a;
}

// Prompt ids both sides compute the same way (scripts/gpu/bench_accelerate.py):
// a 31-bit LCG, ids in [3, vocab), so the greedy continuations can be compared.
at::Tensor prompt_ids(int64_t len, int64_t vocab) {
  std::vector<int64_t> ids(static_cast<size_t>(len));
  uint64_t x = 12345;
  for (auto& id : ids) {
    x = (1103515245ULL * x + 12345ULL) % (1ULL << 31);
    id = 3 + static_cast<int64_t>((x >> 8) % static_cast<uint64_t>(vocab - 3));
  }
  return at::tensor(ids, at::kLong).unsqueeze(0);
}

// Waits for the GPU work queued on `t`'s device (current stream), so a clock
// read afterwards sees the step finished. No-op on the CPU.
void sync_device(const at::Tensor& t) {
  if (!t.defined() || !t.is_cuda()) return;
  try {
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    impl->synchronizeStream(impl->getStream(t.device()));
  } catch (const std::exception&) {
    (void)t.reshape({-1}).narrow(0, 0, 1).to(at::kCPU);  // a device-to-host copy waits too
  }
}

double seconds_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

struct RunResult {
  double prompt_ms = 0, decode_tok_s = 0, total_s = 0;
  int64_t generated = 0;
  std::vector<int64_t> tokens;
};

// One generate() through `step`, timing every step's end.
RunResult timed_generate(const flex::LogitsFn& step, const flex::ModelConfig& cfg, const at::Tensor& ids,
                         int64_t new_tokens) {
  std::vector<Clock::time_point> ends;
  ends.reserve(static_cast<size_t>(new_tokens));
  flex::LogitsFn timed = [&](const flex::LMInputs& in) {
    at::Tensor logits = step(in);
    sync_device(logits);
    ends.push_back(Clock::now());
    return logits;
  };
  flex::GenerateOptions g;
  g.max_new_tokens = new_tokens;
  g.do_sample = false;
  g.use_cache = true;
  g.stop_tokens = std::vector<int64_t>{};  // never stop early: always new_tokens steps
  g.pad_token_id = 0;
  sync_device(ids);
  const auto t0 = Clock::now();
  flex::GenerateOutput out = flex::generate(timed, cfg, ids, at::Tensor(), g);
  const auto t1 = Clock::now();
  RunResult r;
  r.generated = out.num_generated.at(0);
  r.total_s = seconds_since(t0, t1);
  if (!ends.empty()) r.prompt_ms = 1e3 * seconds_since(t0, ends.front());
  if (ends.size() >= 2)
    r.decode_tok_s = static_cast<double>(ends.size() - 1) / seconds_since(ends.front(), ends.back());
  r.tokens = out.new_tokens(0);
  return r;
}

struct CaptureCheck {
  int64_t tensors = 0, bytes = 0;
  bool ok = true;
  std::string problem;
};

CaptureCheck check_captures(const flex::OutputMap& out, const std::vector<std::string>& names, int64_t calls,
                            int64_t prompt_len) {
  CaptureCheck c;
  for (const auto& name : names) {
    auto it = out.find(name);
    const int64_t n = it == out.end() ? 0 : static_cast<int64_t>(it->second.size());
    if (n != calls) {
      c.ok = false;
      c.problem = name + ": " + std::to_string(n) + " captures, expected " + std::to_string(calls);
    }
    if (it == out.end()) continue;
    for (size_t i = 0; i < it->second.size(); ++i) {
      const at::Tensor& t = it->second[i];
      ++c.tensors;
      c.bytes += static_cast<int64_t>(t.numel() * t.element_size());
      if (!t.device().is_cpu()) {
        c.ok = false;
        c.problem = name + " capture " + std::to_string(i) + " is on " + t.device().str() + ", not the CPU";
      }
      const int64_t want = i == 0 ? prompt_len : 1;
      if (t.dim() != 3 || t.size(1) != want) {
        c.ok = false;
        c.problem = name + " capture " + std::to_string(i) + " has an unexpected shape";
      }
    }
  }
  return c;
}

// Host-to-device bandwidth from pinned memory (GB/s): 256 MiB copied with
// non_blocking 8 times, timed around a stream synchronisation. 0 on the CPU.
double pinned_h2d_gb_s(const c10::Device& device) {
  if (!device.is_cuda()) return 0;
  const int64_t bytes = int64_t(256) << 20;
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  host.fill_(1);
  at::Tensor dev = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  dev.copy_(host, /*non_blocking=*/true);  // warm-up
  sync_device(dev);
  const int reps = 8;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) dev.copy_(host, /*non_blocking=*/true);
  sync_device(dev);
  return static_cast<double>(bytes) * reps / seconds_since(t0, Clock::now()) / 1e9;
}

struct DiskRate {
  double cold_gb_s = 0, warm_gb_s = 0;
  int64_t bytes = 0;
  int files = 0;
};

// Read rate of the files the disk blocks come from (the offload folder's
// .dat files when it has them, else the checkpoint's .safetensors), in 16 MiB
// reads, up to 2 GiB: once after asking the kernel to drop the files' cached
// pages (cold: the device's rate where the drop succeeded) and once more
// (warm: the page cache, which is what repeated decode steps read).
DiskRate disk_read_rate(const std::string& model_dir, const std::string& offload_folder) {
  std::vector<fs::path> files;
  auto collect = [&](const std::string& dir, const std::string& ext) {
    std::error_code ec;
    if (dir.empty() || !fs::is_directory(dir, ec)) return;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file() && e.path().extension() == ext) files.push_back(e.path());
  };
  collect(offload_folder, ".dat");
  if (files.empty()) collect(model_dir, ".safetensors");
  std::sort(files.begin(), files.end());
  const int64_t cap = int64_t(2) << 30;
  std::vector<char> buf(size_t(16) << 20);
  auto pass = [&](bool drop) {
    int64_t total = 0;
    const auto t0 = Clock::now();
    for (const auto& f : files) {
      if (total >= cap) break;
      const int fd = ::open(f.c_str(), O_RDONLY);
      if (fd < 0) continue;
      if (drop) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // advice: may leave pages cached
      ssize_t n;
      while (total < cap && (n = ::read(fd, buf.data(), buf.size())) > 0) total += n;
      ::close(fd);
    }
    return std::make_pair(total, seconds_since(t0, Clock::now()));
  };
  DiskRate r;
  r.files = static_cast<int>(files.size());
  if (files.empty()) return r;
  const auto cold = pass(true);
  const auto warm = pass(false);
  r.bytes = cold.first;
  if (cold.second > 0) r.cold_gb_s = static_cast<double>(cold.first) / cold.second / 1e9;
  if (warm.second > 0) r.warm_gb_s = static_cast<double>(warm.first) / warm.second / 1e9;
  return r;
}

int write_tiny_llama(const std::string& dir) {
  const std::string config =
      "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 256, "
      "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
      "\"num_key_value_heads\": 2, \"head_dim\": 16, \"hidden_act\": \"silu\", \"max_position_embeddings\": 256, "
      "\"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"bos_token_id\": 1, "
      "\"eos_token_id\": 2, \"torch_dtype\": \"float32\"}";
  bench::write_random_model(dir, config);
  std::printf("wrote %s\n", dir.c_str());
  return 0;
}

}  // namespace

static int run_bench(const Args& a);

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines appear even if the run is cut short
  try {
    if (argc == 3 && !std::strcmp(argv[1], "--write-tiny-llama")) return write_tiny_llama(argv[2]);
    return run_bench(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_offload: %s\n", e.what());
    return 1;
  }
}

// --graph-modes 1 (gpu-only): flexmodel's decode modes side by side, one
// generate(model) each (design decision 51): eager, eager with the capture
// modules as taps, cuda-graph, cuda-graph with the same taps; interleaved per
// repeat. Decode = (n - 2) / (time of n new tokens - time of 2): the steady
// state, without the prompt and the first step (where the graph is recorded).
// Tokens compared with the eager mode's; every tap must hold one tensor per
// model call.
static int run_graph_modes(flex::CausalLM& model, const at::Tensor& ids, const Args& a, const nlohmann::json& base,
                           const std::vector<std::string>& taps) {
  struct Mode {
    const char* name;
    bool graph, tapped;
  };
  const std::vector<Mode> modes = {{"eager", false, false}, {"eager", false, true}, {"cuda-graph", true, false},
                                   {"cuda-graph", true, true}};
  auto timed = [&](const Mode& m, int64_t n, flex::GenerateOutput* out) {
    flex::GenerateOptions g;
    g.max_new_tokens = n;
    g.stop_tokens = std::vector<int64_t>{};
    g.pad_token_id = 0;
    // On the CPU (a dry run) the static step runs eagerly instead of a graph.
    g.cuda_graph = m.graph && ids.is_cuda();
    g.static_step = m.graph && !ids.is_cuda();
    if (m.tapped) g.taps = taps;
    sync_device(ids);
    const auto t0 = Clock::now();
    flex::GenerateOutput o = flex::generate(model, ids, at::Tensor(), g);
    sync_device(o.sequences);
    const double s = seconds_since(t0, Clock::now());
    if (out) *out = std::move(o);
    return s;
  };
  for (const Mode& m : modes) timed(m, std::min<int64_t>(a.warmup_tokens, a.new_tokens), nullptr);  // warm-up
  bool ok = true;
  for (int run = 0; run < a.repeats; ++run) {
    std::vector<int64_t> eager_tokens;
    for (const Mode& m : modes) {
      flex::GenerateOutput out;
      const double t2 = timed(m, 2, nullptr);
      const double tn = timed(m, a.new_tokens, &out);
      const std::vector<int64_t> tokens = out.new_tokens(0);
      if (eager_tokens.empty()) eager_tokens = tokens;
      nlohmann::json j = base;
      j["mode"] = m.graph && !ids.is_cuda() ? "static-step" : m.name;
      j["capture"] = m.tapped ? static_cast<int>(taps.size()) : 0;
      j["run"] = run;
      j["prompt_ms"] = nullptr;
      j["decode_tok_s"] = tn > t2 ? static_cast<double>(a.new_tokens - 2) / (tn - t2) : 0.0;
      j["total_s"] = tn;
      j["generated"] = static_cast<int64_t>(tokens.size());
      j["tokens_head"] = std::vector<int64_t>(tokens.begin(), tokens.begin() + std::min<size_t>(8, tokens.size()));
      j["tokens_match_plain"] = tokens == eager_tokens;
      bool taps_ok = true;
      if (m.tapped)
        for (const auto& name : taps) {
          auto it = out.taps.find(name);
          taps_ok = taps_ok && it != out.taps.end() && static_cast<int64_t>(it->second.size()) == a.new_tokens;
        }
      j["captures_on_cpu_ok"] = taps_ok;  // (the table's capture check; taps stay on the device)
      ok = ok && taps_ok && tokens == eager_tokens && static_cast<int64_t>(tokens.size()) == a.new_tokens;
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  if (!ok) {
    std::fprintf(stderr, "bench_gpu_offload: a decode mode gave other tokens, too few tokens or incomplete taps\n");
    return 3;
  }
  return 0;
}

static int run_bench(const Args& a) {
  if (a.threads > 0) at::set_num_threads(a.threads);

  const flex::DeviceMap map = flex::DeviceMap::load(a.device_map);
  flex::PretrainedOptions o;
  o.device_map = map;
  o.torch_dtype = a.dtype;
  if (!a.offload_folder.empty()) o.offload_folder = a.offload_folder;
  if (a.prefetch >= 0) o.prefetch_depth = a.prefetch;
  // The bounds, measured in this run before the model maps its files.
  c10::Device device(at::kCPU);  // where inputs go: the map's first GPU (Transformers' model.device), else the CPU
  for (const auto& d : map.devices())
    if (d.is_gpu()) {
      device = d.torch_device();
      break;
    }
  const double h2d_gb_s = pinned_h2d_gb_s(device);
  const DiskRate disk = disk_read_rate(a.model, a.offload_folder);
  std::fprintf(stderr, "bench_gpu_offload: pinned host-to-device %.2f GB/s; disk read %.2f GB/s cold, %.2f GB/s warm "
                       "(%d files, %.0f MB)\n", h2d_gb_s, disk.cold_gb_s, disk.warm_gb_s, disk.files, disk.bytes / 1e6);
  auto t_load = Clock::now();
  std::shared_ptr<flex::CausalLM> model = flex::from_pretrained(a.model, o);
  const double load_s = seconds_since(t_load, Clock::now());
  const flex::ModelConfig& cfg = model->config();

  // Blocks (the architecture's no-split classes) per device kind.
  std::map<std::string, int> counts{{"gpu", 0}, {"cpu", 0}, {"disk", 0}};
  const auto block_classes = model->no_split_modules();
  std::vector<std::string> block_names;
  for (const auto& [name, m] : model->named_flex_modules())
    if (std::find(block_classes.begin(), block_classes.end(), m->class_name()) != block_classes.end()) {
      block_names.push_back(name);
      const auto d = map.device_of(name);
      counts[!d ? "cpu" : d->is_gpu() ? "gpu" : d->is_disk() ? "disk" : "cpu"] += 1;
    }

  // Bytes each decode step brings in: weights of blocks mapped to the CPU
  // (moved to the GPU every step when it runs on one) and to disk.
  int64_t cpu_bytes = 0, disk_bytes = 0;
  for (const auto& item : model->named_parameters()) {
    const at::Tensor& p = item.value();
    const auto d = map.device_of(item.key());
    const int64_t b = p.numel() * static_cast<int64_t>(p.element_size());
    if (d && d->is_disk()) disk_bytes += b;
    else if (d && d->is_cpu() && device.is_cuda()) cpu_bytes += b;
  }
  // The step's transfer bound: PCIe for everything offloaded (CUDA), the
  // disk (warm: page cache; cold: the device) for the disk part, overlapped.
  auto bound = [&](double disk_gb_s) {
    const double t_pcie = h2d_gb_s > 0 ? static_cast<double>(cpu_bytes + disk_bytes) / (h2d_gb_s * 1e9) : 0;
    const double t_disk = disk_gb_s > 0 ? static_cast<double>(disk_bytes) / (disk_gb_s * 1e9) : 0;
    const double t = std::max(t_pcie, t_disk);
    return t > 0 ? 1.0 / t : 0.0;
  };
  const double bound_warm = bound(disk.warm_gb_s), bound_cold = bound(disk.cold_gb_s);

  const at::Tensor ids = prompt_ids(a.prompt_len, cfg.vocab_size).to(device);
  const flex::LogitsFn plain = [&](const flex::LMInputs& in) { return model->run(in).logits; };
  // The same step through a FlexModel (its hooks fire inside model->operator()).
  auto through = [](flex::FlexModel& fm) {
    return flex::LogitsFn(
        [&fm](const flex::LMInputs& in) { return flex::LMOutput::from_value(fm.forward(in.to_inputs())).logits; });
  };

  // Capture names: the MLP of each of the first N blocks.
  std::vector<std::string> capture_names;
  for (int i = 0; i < a.capture && i < static_cast<int>(block_names.size()); ++i)
    capture_names.push_back(block_names[static_cast<size_t>(i)] + ".mlp");
  std::fprintf(stderr,
               "bench_gpu_offload: %s loaded in %.1f s; blocks gpu/cpu/disk %d/%d/%d; inputs on %s; "
               "capturing %zu modules%s%s\n",
               a.model.c_str(), load_s, counts["gpu"], counts["cpu"], counts["disk"], device.str().c_str(),
               capture_names.size(), capture_names.empty() ? "" : ", first ",
               capture_names.empty() ? "" : capture_names[0].c_str());

  nlohmann::json base;
  base["impl"] = "flexmodel";
  base["config"] = a.config;
  base["prefetch"] = a.prefetch >= 0 ? nlohmann::json(a.prefetch) : nlohmann::json("default");
  base["h2d_pinned_gb_s"] = h2d_gb_s;
  base["disk_read_cold_gb_s"] = disk.cold_gb_s;
  base["disk_read_warm_gb_s"] = disk.warm_gb_s;
  base["offloaded_mb_per_token"] = {{"cpu", cpu_bytes / 1e6}, {"disk", disk_bytes / 1e6}};
  base["bound_tok_s"] = bound_warm;
  base["bound_tok_s_cold_disk"] = bound_cold;
  base["prompt_len"] = a.prompt_len;
  base["new_tokens"] = a.new_tokens;
  base["dtype"] = a.dtype;
  base["device"] = device.str();
  base["threads"] = at::get_num_threads();
  base["load_s"] = load_s;
  base["device_map_counts"] = counts;

  at::NoGradGuard no_grad;
  if (a.graph_modes) return run_graph_modes(*model, ids, a, base, capture_names);
  // Warm-up (allocator, kernels, page cache), both paths.
  timed_generate(plain, cfg, ids, a.warmup_tokens);
  if (!capture_names.empty()) {
    flex::FlexModel fm(model);
    for (const auto& n : capture_names) fm.register_forward_hook(std::make_shared<flex::HookFunction>(n));
    timed_generate(through(fm), cfg, ids, std::min<int64_t>(a.warmup_tokens, 2));
  }

  bool all_ok = true;
  std::vector<int64_t> plain_tokens;
  auto emit = [&](int run, int capture, const RunResult& r, const CaptureCheck* c) {
    nlohmann::json j = base;
    j["capture"] = capture;
    j["run"] = run;
    j["prompt_ms"] = r.prompt_ms;
    j["decode_tok_s"] = r.decode_tok_s;
    if (bound_warm > 0) j["decode_of_bound"] = r.decode_tok_s / bound_warm;
    if (bound_cold > 0) j["decode_of_bound_cold_disk"] = r.decode_tok_s / bound_cold;
    // Whether the read-ahead ran, and what it did so far (cumulative over the runs).
    const auto ps = flex::block_prefetch_stats(*model);
    j["prefetch_applied"] = ps.has_value() && ps->blocks_prefetched > 0;
    if (ps)
      j["prefetch_stats"] = {{"depth", ps->depth},         {"blocks", ps->blocks},
                             {"blocks_prefetched", ps->blocks_prefetched},
                             {"mb_prefetched", ps->bytes_prefetched / 1e6},
                             {"read_s", ps->read_seconds}, {"hits", ps->hits},
                             {"misses", ps->misses},       {"waits", ps->waits}};
    j["total_s"] = r.total_s;
    j["generated"] = r.generated;
    j["tokens_head"] = std::vector<int64_t>(r.tokens.begin(), r.tokens.begin() + std::min<size_t>(8, r.tokens.size()));
    if (r.generated != a.new_tokens) all_ok = false;
    if (c) {
      j["captured_tensors"] = c->tensors;
      j["captured_mb"] = static_cast<double>(c->bytes) / 1e6;
      j["captures_on_cpu_ok"] = c->ok;
      if (!c->ok) j["capture_problem"] = c->problem;
      j["tokens_match_plain"] = r.tokens == plain_tokens;
      all_ok = all_ok && c->ok;
    }
    std::printf("%s\n", j.dump().c_str());
  };

  for (int run = 0; run < a.repeats; ++run) {
    const RunResult p = timed_generate(plain, cfg, ids, a.new_tokens);
    plain_tokens = p.tokens;
    emit(run, 0, p, nullptr);
    if (capture_names.empty()) continue;
    auto out = std::make_shared<flex::OutputMap>();
    RunResult c;
    CaptureCheck check;
    {
      flex::FlexModel fm(model, out);
      for (const auto& n : capture_names) fm.register_forward_hook(std::make_shared<flex::HookFunction>(n));
      c = timed_generate(through(fm), cfg, ids, a.new_tokens);
      check = check_captures(fm.output(), capture_names, a.new_tokens, a.prompt_len);
    }  // hooks removed here: the next plain run has none
    emit(run, static_cast<int>(capture_names.size()), c, &check);
  }
  if (!all_ok) {
    std::fprintf(stderr, "bench_gpu_offload: a run generated too few tokens or a capture check failed\n");
    return 3;
  }
  return 0;
}
