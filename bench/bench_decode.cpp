// Greedy decoding speed, flexmodel against Transformers (+ bitsandbytes) in
// the same run: a Llama-shaped ~1.1B model (TinyLlama's shape: 22 x 2048,
// MLP 5632, 32/4 heads, vocab 32000; random weights written once) and GPT-2
// small, prompt 1 x P then N new tokens (default 128 + 128), in fp32, bf16,
// int8 and nf4 (quantized models keep embeddings, norms and head in bf16, as
// bitsandbytes does), and with 12 FlexModel captures attached. For each:
// prompt latency, ms/token and tokens/s of the decode steps, the bytes of
// weights a decode step reads (every weight once; the embedding tables but
// one row) and the effective GB/s against this machine's read bandwidth,
// measured in the same run. The variants are interleaved round by round;
// each peer is a Python process (bench/peers/hf_decode.py) that keeps its
// model loaded and runs when told, timed the same way (a prompt forward,
// then generate; decode = (generate - prompt forward) / (N - 1)).
// Every model but "fp32 mmap" holds its weights in process memory
// (PretrainedOptions::mmap = false for fp32; converted formats always do):
// mapped file pages read ~40% slower here, which would flatter the others.
// Run with libgomp's default wait policy: OMP_WAIT_POLICY=PASSIVE puts the
// worker threads to sleep between the ~150 parallel regions of a decode
// step and costs ~20 ms per token on 2 cores (ours and the peers alike).
//
//
// --models gguf: GGUF files of a Llama-shaped model with random weights
// (bench/peers/make_bench_gguf.py: 1.1b TinyLlama-shaped by default, 0.5b
// for a quicker run) at F32, BF16, Q8_0, Q4_0 and Q4_K_M, against llama.cpp
// (llama-cpp-python 0.3.36, install-deps.sh --bench; bench/peers/
// llama_cpp_decode.py) on the same file: flexmodel faithful (float
// activations), with --fast-activations, and with 12 captures; each side's
// tok/s and roofline fraction, prompt time, and greedy-token agreement.
// The issue's check: --models gguf --prompt 128 --new 65.
//
//   ./bench_decode [--rounds R] [--threads T] [--prompt P] [--new N]
//        [--models llama,gpt2,gguf] [--formats fp32,bf16,int8,nf4] [--python PY | --no-peers] [--work DIR]
//        [--gguf-size 1.1b|0.5b|tiny] [--gguf-formats F32,BF16,Q8_0,Q4_0,Q4_K_M] [--gguf-python PY]
#include "bench_util.h"

#include <flex/flexcore/flex_model.h>
#include <flex/models/from_pretrained.h>
#include <flex/models/generate.h>
#include <flex/kernels/cpu_isa.h>
#include <flex/kernels/memory_reuse.h>

#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <map>
#include <sstream>

namespace fs = std::filesystem;

namespace {

const char* kLlama1B = R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
  "hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
  "intermediate_size": 5632, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2})";

struct Args {
  int rounds = 2, threads = 2, prompt = 128, new_tokens = 128;
  std::vector<std::string> models{"llama", "gpt2"}, formats{"fp32", "bf16", "int8", "nf4"};
  std::string python = std::string(FLEX_SOURCE_DIR) + "/scripts/golden/.venv/bin/python";
  bool peers = true;
  std::string work = (fs::temp_directory_path() / "flex_bench_decode").string();
  // --models gguf: the GGUF files (make_bench_gguf.py, run by gguf_python, which also runs llama.cpp).
  std::string gguf_size = "1.1b";
  std::vector<std::string> gguf_formats{"F32", "BF16", "Q8_0", "Q4_0", "Q4_K_M"};
  std::string gguf_python = "python3";
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');)
    if (!x.empty()) v.push_back(x);
  return v;
}

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(k + " needs a value");
      return argv[++i];
    };
    if (k == "--rounds") a.rounds = std::stoi(val());
    else if (k == "--threads") a.threads = std::stoi(val());
    else if (k == "--prompt") a.prompt = std::stoi(val());
    else if (k == "--new") a.new_tokens = std::stoi(val());
    else if (k == "--models") a.models = split(val());
    else if (k == "--formats") a.formats = split(val());
    else if (k == "--python") a.python = val();
    else if (k == "--no-peers") a.peers = false;
    else if (k == "--work") a.work = val();
    else if (k == "--gguf-size") a.gguf_size = val();
    else if (k == "--gguf-formats") a.gguf_formats = split(val());
    else if (k == "--gguf-python") a.gguf_python = val();
    else {
      std::fprintf(stderr,
                   "usage: bench_decode [--rounds R] [--threads T] [--prompt P] [--new N] [--models llama,gpt2] "
                   "[--formats fp32,bf16,int8,nf4] [--python PY | --no-peers] [--work DIR] [--gguf-size 1.1b|0.5b|tiny] "
                   "[--gguf-formats F32,BF16,Q8_0,Q4_0,Q4_K_M] [--gguf-python PY]\n");
      return false;
    }
  }
  return a.new_tokens >= 2 && a.rounds >= 1;
}

flex::PretrainedOptions options(const std::string& format, bool mmap) {
  flex::PretrainedOptions o;
  o.mmap = mmap;
  if (format == "bf16") o.torch_dtype = "bfloat16";
  if (format == "int8" || format == "nf4") {
    o.quantization = flex::quantization_from_string(format, at::kBFloat16);
    o.torch_dtype = "bfloat16";
  }
  return o;
}

at::Tensor prompt_ids(int n, int64_t vocab) {
  at::Tensor ids = at::empty({1, n}, at::kLong);
  for (int i = 0; i < n; ++i) ids[0][i] = (static_cast<int64_t>(i) * 7919 + 13) % vocab;
  return ids;
}

// Bytes a decode step reads of the model's tensors: each storage once, the
// input embedding tables only for their one row (unless the head shares them).
double weight_bytes_per_token(flex::CausalLM& model) {
  const std::string head = flex::output_head_name(model);
  const void* head_ptr = nullptr;
  for (const auto& [name, t] : flex::state_dict(model))
    if (name == head + ".weight") head_ptr = t.data_ptr();
  std::set<const void*> embedding_tables;
  for (const auto& item : model.named_modules())
    if (auto* e = dynamic_cast<flex::Embedding*>(item.value().get()))
      if (e->weight.data_ptr() != head_ptr) embedding_tables.insert(e->weight.data_ptr());
  std::set<const void*> seen;
  double bytes = 0;
  for (const auto& [name, t] : flex::state_dict(model)) {
    if (!seen.insert(t.data_ptr()).second) continue;
    bytes += embedding_tables.count(t.data_ptr()) ? static_cast<double>(t.nbytes()) / t.size(0) : t.nbytes();
  }
  return bytes;
}

// This machine's read bandwidth with the benchmark's threads: the better of
// two reads of 1 GiB of process memory, a sum and libtorch's fp32 GEMV (the
// faster read kernel here: the roofline is against the best we can measure).
double read_bandwidth_gbs() {
  const at::Tensor buf = at::ones({1 << 28}, at::kFloat);
  const at::Tensor mat = buf.view({1 << 15, 1 << 13}), x = at::ones({1, 1 << 13});
  std::vector<double> sum_s, gemv_s;
  for (int i = 0; i < 7; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    volatile float s = buf.sum().item<float>();
    (void)s;
    auto t1 = std::chrono::steady_clock::now();
    volatile float g = at::linear(x, mat).max().item<float>();
    (void)g;
    auto t2 = std::chrono::steady_clock::now();
    sum_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    gemv_s.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  return buf.nbytes() / std::min(bench::median(sum_s), bench::median(gemv_s)) / 1e9;
}

// A peer process with a line protocol on its stdin / stdout.
class Peer {
 public:
  Peer(const std::vector<std::string>& args) {
    int in[2], out[2];
    // Close-on-exec: a later peer must not inherit this one's stdin (it would never see EOF).
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    for (int fd : {in[0], in[1], out[0], out[1]}) posix_spawn_file_actions_addclose(&fa, fd);
    std::vector<std::string> all = args;
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, all[0].c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_ = ::fdopen(in[1], "w");
    from_ = ::fdopen(out[0], "r");
    if (rc != 0) throw std::runtime_error("cannot start " + all[0] + ": " + std::strerror(rc));
  }
  ~Peer() {
    if (to_) std::fclose(to_);
    if (from_) std::fclose(from_);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  nlohmann::json read() {
    char* line = nullptr;
    size_t cap = 0;
    const ssize_t n = ::getline(&line, &cap, from_);
    std::string s = n > 0 ? std::string(line, static_cast<size_t>(n)) : std::string();
    std::free(line);
    if (s.empty()) throw std::runtime_error("peer exited");
    return nlohmann::json::parse(s);
  }
  nlohmann::json run() {
    std::fputs("run\n", to_);
    std::fflush(to_);
    return read();
  }

 private:
  pid_t pid_ = 0;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

struct Timing {
  std::vector<double> prefill_ms, decode_ms;
  std::vector<int64_t> tokens;
  void add(double prefill, double total, int new_tokens) {
    prefill_ms.push_back(prefill);
    decode_ms.push_back((total - prefill) / (new_tokens - 1));
  }
};

struct Variant {
  Variant(std::string l, std::string f, bool c = false, bool m = false)
      : label(std::move(l)), format(std::move(f)), captures(c), mmap(m) {}
  std::string label, format;
  bool captures = false;
  bool mmap = false;  // fp32 weights left as views of the mapped checkpoint
  std::shared_ptr<flex::CausalLM> model;
  std::vector<std::string> capture_modules;  // hooked for this variant's runs
  std::unique_ptr<Peer> peer;
  std::string peer_error;
  double bytes = 0;
  Timing ours, theirs;
};

void run_ours(Variant& v, const at::Tensor& ids, const Args& a) {
  at::NoGradGuard ng;
  flex::GenerateOptions g;
  g.max_new_tokens = a.new_tokens;
  g.stop_tokens = std::vector<int64_t>{};  // never stop early
  g.pad_token_id = 0;
  std::unique_ptr<flex::FlexModel> flex;  // its destructor removes the hooks
  if (!v.capture_modules.empty()) {
    flex = std::make_unique<flex::FlexModel>(v.model);
    for (const std::string& m : v.capture_modules) flex->register_forward_hook(std::make_shared<flex::HookFunction>(m));
  }
  const auto t0 = std::chrono::steady_clock::now();
  v.model->logits(ids);
  const auto t1 = std::chrono::steady_clock::now();
  const flex::GenerateOutput out = flex::generate(*v.model, ids, {}, g);
  const auto t2 = std::chrono::steady_clock::now();
  v.ours.add(std::chrono::duration<double, std::milli>(t1 - t0).count(),
             std::chrono::duration<double, std::milli>(t2 - t1).count(), a.new_tokens);
  v.ours.tokens = out.new_tokens(0);
}

void run_theirs(Variant& v, const Args& a) {
  if (!v.peer) return;
  const nlohmann::json r = v.peer->run();
  v.theirs.add(r.at("prefill_ms").get<double>(), r.at("total_ms").get<double>(), a.new_tokens);
  v.theirs.tokens = r.at("tokens").get<std::vector<int64_t>>();
}

void bench_model(const std::string& name, const Args& a, double bandwidth) {
  const fs::path dir = fs::path(a.work) / name;
  if (!fs::exists(dir / "model.safetensors")) {
    std::printf("writing the random %s checkpoint to %s ...\n", name.c_str(), dir.c_str());
    std::fflush(stdout);
    bench::run_child({"--write-child", name, dir.string()});
  }
  std::vector<Variant> vs;
  for (const std::string& f : a.formats) {
    vs.emplace_back(f, f);
    if (f == "fp32" || f == "nf4") vs.emplace_back(f + "+12 captures", f, true);
    if (f == "fp32") vs.emplace_back("fp32 mmap", f, false, true);
  }
  std::string peer_versions;
  for (Variant& v : vs) {
    // A captures variant shares the plain variant's model (one copy of the
    // weights in memory) and attaches its FlexModel only for its own runs.
    for (Variant& u : vs)
      if (v.captures && &u != &v && u.format == v.format && !u.captures && !u.mmap && u.model) v.model = u.model;
    if (!v.model) v.model = flex::from_pretrained(dir.string(), options(v.format, v.mmap));
    v.bytes = weight_bytes_per_token(*v.model);
    if (v.captures) {
      const int layers = v.model->config().num_hidden_layers;
      for (int i = 0; i < 12; ++i)
        v.capture_modules.push_back((name == "gpt2" ? "transformer.h." : "model.layers.") + std::to_string(i * layers / 12));
    } else if (a.peers && !v.mmap) {
      v.peer = std::make_unique<Peer>(std::vector<std::string>{
          a.python, std::string(FLEX_SOURCE_DIR) + "/bench/peers/hf_decode.py", dir.string(), v.format, "--threads",
          std::to_string(a.threads), "--prompt", std::to_string(a.prompt), "--new", std::to_string(a.new_tokens)});
      const nlohmann::json hello = v.peer->read();
      if (hello.contains("error")) {
        v.peer_error = hello.at("error").get<std::string>();
        v.peer.reset();
      } else if (hello.contains("versions")) {
        peer_versions = hello.at("versions").dump();
      }
    }
  }
  const at::Tensor ids = prompt_ids(a.prompt, vs.front().model->config().vocab_size);
  // Warm-up (one short generate each), then the interleaved rounds.
  {
    Args warm = a;
    warm.new_tokens = 2;
    for (Variant& v : vs) run_ours(v, ids, warm);
    for (Variant& v : vs) v.ours = Timing();
  }
  for (int r = 0; r < a.rounds; ++r)
    for (Variant& v : vs) {
      run_ours(v, ids, a);
      run_theirs(v, a);
      std::fprintf(stderr, "  round %d %-18s ours %.1f ms/token%s\n", r + 1, v.label.c_str(), v.ours.decode_ms.back(),
                   v.theirs.decode_ms.empty() ? "" : (", theirs " + std::to_string(v.theirs.decode_ms.back())).c_str());
    }
  std::printf("\n%s, prompt 1x%d + %d new tokens, %d threads, ISA %s; read bandwidth %.1f GB/s; medians of %d rounds\n",
              name.c_str(), a.prompt, a.new_tokens, a.threads, flex::to_string(flex::cpu_isa()).c_str(), bandwidth,
              a.rounds);
  if (!peer_versions.empty()) std::printf("peers: %s\n", peer_versions.c_str());
  std::printf("| %-18s | %9s | %8s | %8s | %10s | %8s | %8s | %9s | %9s | %9s | %s |\n", "format", "MB/token", "tok/s",
              "ms/token", "prefill ms", "GB/s", "roofline", "HF tok/s", "HF pref.", "ours/HF", "same tokens as HF");
  double fp32_tps = 0;
  for (Variant& v : vs) {
    const double ms = bench::median(v.ours.decode_ms), tps = 1000.0 / ms;
    if (v.label == "fp32") fp32_tps = tps;
    const double gbs = v.bytes / (ms / 1000.0) / 1e9;
    std::string hf_tps = "-", hf_pre = "-", ratio = "-", same = v.peer_error.empty() ? "-" : "peer failed";
    if (!v.theirs.decode_ms.empty()) {
      const double t = 1000.0 / bench::median(v.theirs.decode_ms);
      char b[64];
      std::snprintf(b, sizeof b, "%.2f", t);
      hf_tps = b;
      std::snprintf(b, sizeof b, "%.0f", bench::median(v.theirs.prefill_ms));
      hf_pre = b;
      std::snprintf(b, sizeof b, "%.2fx", tps / t);
      ratio = b;
      size_t k = 0;
      while (k < v.ours.tokens.size() && k < v.theirs.tokens.size() && v.ours.tokens[k] == v.theirs.tokens[k]) ++k;
      same = "first " + std::to_string(k) + " of " + std::to_string(v.ours.tokens.size());
    }
    std::printf("| %-18s | %9.1f | %8.2f | %8.2f | %10.0f | %8.1f | %8.2f | %9s | %9s | %9s | %s |\n", v.label.c_str(),
                v.bytes / 1e6, tps, ms, bench::median(v.ours.prefill_ms), gbs, gbs / bandwidth, hf_tps.c_str(),
                hf_pre.c_str(), ratio.c_str(), same.c_str());
  }
  for (Variant& v : vs)
    if (!v.peer_error.empty()) std::printf("peer %s: %s\n", v.format.c_str(), v.peer_error.c_str());
  if (fp32_tps > 0) {
    std::printf("speed-up over fp32 (tokens/s):");
    for (Variant& v : vs) std::printf(" %s %.2fx;", v.label.c_str(), 1000.0 / bench::median(v.ours.decode_ms) / fp32_tps);
    std::printf("\n");
  }
  std::fflush(stdout);
}

// --- GGUF files against llama.cpp ---------------------------------------------------

// Runs a command to its end (posix_spawn: no fork of this libtorch process).
void run_command(const std::vector<std::string>& args) {
  std::vector<std::string> all = args;
  std::vector<char*> argv;
  for (auto& x : all) argv.push_back(x.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, all[0].c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0) throw std::runtime_error("cannot start " + all[0] + ": " + std::strerror(rc));
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error(all[0] + " " + all[1] + " failed");
}

struct GgufVariant {
  std::string format, label;
  bool fast = false, captures = false;
  std::shared_ptr<flex::CausalLM> model;
  Variant run{"", ""};  // its timings (ours) and capture modules
  double bytes = 0;
};

// One GGUF file per format, written once by make_bench_gguf.py; per format
// flexmodel (faithful float activations; with --fast-activations for the
// quantized types; and with 12 captures) and llama.cpp on the same file,
// interleaved round by round. Decode from prompt 1 x P then N new tokens.
// `name` as a path: itself when it has a '/', else the first match on $PATH (Peer spawns by path).
std::string on_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  std::stringstream dirs(std::getenv("PATH") ? std::getenv("PATH") : "");
  for (std::string d; std::getline(dirs, d, ':');)
    if (!d.empty() && ::access((fs::path(d) / name).c_str(), X_OK) == 0) return (fs::path(d) / name).string();
  throw std::runtime_error("no " + name + " on PATH (--gguf-python)");
}

void bench_gguf(const Args& args, double bandwidth) {
  Args a = args;
  a.gguf_python = on_path(a.gguf_python);
  const fs::path dir = fs::path(a.work) / ("gguf-" + a.gguf_size);
  fs::create_directories(dir);
  std::vector<GgufVariant> vs;
  std::map<std::string, std::unique_ptr<Peer>> peers;
  std::map<std::string, Timing> theirs;
  std::map<std::string, std::string> peer_error;
  std::string versions;
  for (const std::string& f : a.gguf_formats) {
    const fs::path file = dir / (f + ".gguf");
    if (!fs::exists(file)) {
      std::printf("writing the random %s GGUF (%s) to %s ...\n", a.gguf_size.c_str(), f.c_str(), file.c_str());
      std::fflush(stdout);
      const fs::path tmp = file.string() + ".tmp";
      run_command({a.gguf_python, std::string(FLEX_SOURCE_DIR) + "/bench/peers/make_bench_gguf.py", tmp.string(), f,
                   "--size", a.gguf_size});
      fs::rename(tmp, file);
    }
    const bool quantized = f != "F32" && f != "BF16";
    flex::PretrainedOptions o;
    o.mmap = false;
    if (f == "BF16") o.torch_dtype = "bfloat16";
    auto model = flex::from_pretrained(file.string(), o);
    std::shared_ptr<flex::CausalLM> fast;
    if (quantized) {
      o.fast_activations = true;
      fast = flex::from_pretrained(file.string(), o);
    }
    vs.push_back({f, f, false, false, model});
    if (quantized) vs.push_back({f, f + " fast", true, false, fast});
    vs.push_back({f, f + (quantized ? " fast" : "") + " +12 captures", quantized, true, quantized ? fast : model});
    if (a.peers) {
      peers[f] = std::make_unique<Peer>(std::vector<std::string>{
          a.gguf_python, std::string(FLEX_SOURCE_DIR) + "/bench/peers/llama_cpp_decode.py", file.string(),
          "--threads", std::to_string(a.threads), "--prompt", std::to_string(a.prompt), "--new",
          std::to_string(a.new_tokens)});
      const nlohmann::json hello = peers[f]->read();
      if (hello.contains("error")) {
        peer_error[f] = hello.at("error").get<std::string>();
        peers.erase(f);
      } else {
        versions = hello.at("versions").dump();
      }
    }
  }
  for (GgufVariant& v : vs) {
    v.bytes = weight_bytes_per_token(*v.model);
    v.run.model = v.model;
    if (v.captures) {
      const int layers = v.model->config().num_hidden_layers;
      for (int i = 0; i < 12; ++i) v.run.capture_modules.push_back("model.layers." + std::to_string(i * layers / 12));
    }
  }
  const at::Tensor ids = prompt_ids(a.prompt, vs.front().model->config().vocab_size);
  {
    Args warm = a;
    warm.new_tokens = 2;
    for (GgufVariant& v : vs) run_ours(v.run, ids, warm);
    for (GgufVariant& v : vs) v.run.ours = Timing();
    for (auto& [f, peer] : peers) peer->run();  // llama.cpp's first run sets up its buffers
  }
  for (int r = 0; r < a.rounds; ++r)
    for (GgufVariant& v : vs) {
      run_ours(v.run, ids, a);
      std::fprintf(stderr, "  round %d %-24s ours %.1f ms/token", r + 1, v.label.c_str(), v.run.ours.decode_ms.back());
      if (v.label == v.format && peers.count(v.format)) {  // llama.cpp once per format and round, after ours
        const nlohmann::json j = peers[v.format]->run();
        Timing& t = theirs[v.format];
        t.add(j.at("prefill_ms").get<double>(), j.at("total_ms").get<double>(), a.new_tokens);
        t.tokens = j.at("tokens").get<std::vector<int64_t>>();
        std::fprintf(stderr, ", llama.cpp %.1f ms/token", t.decode_ms.back());
      }
      std::fprintf(stderr, "\n");
    }
  std::printf("\nGGUF %s Llama (random weights), prompt 1x%d + %d new tokens, %d threads, ISA %s; read bandwidth %.1f "
              "GB/s; medians of %d rounds\n",
              a.gguf_size.c_str(), a.prompt, a.new_tokens, a.threads, flex::to_string(flex::cpu_isa()).c_str(), bandwidth,
              a.rounds);
  if (!versions.empty()) std::printf("peer: %s\n", versions.c_str());
  std::printf("| %-24s | %8s | %8s | %8s | %10s | %9s | %8s | %10s | %9s | %s |\n", "flexmodel", "MB/token", "tok/s",
              "roofline", "prefill ms", "llama.cpp", "roofline", "prefill ms", "flex/llama", "same greedy tokens");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (GgufVariant& v : vs) {
    const double tps = 1000.0 / bench::median(v.run.ours.decode_ms);
    const double roof = v.bytes * tps / 1e9 / bandwidth;
    std::string lt = "-", lroof = "-", lpre = "-", ratio = "-", same = peer_error.count(v.format) ? "peer failed" : "-";
    auto it = theirs.find(v.format);
    if (it != theirs.end() && !it->second.decode_ms.empty()) {
      const double t = 1000.0 / bench::median(it->second.decode_ms);
      char b[64];
      std::snprintf(b, sizeof b, "%.2f", t);
      lt = b;
      std::snprintf(b, sizeof b, "%.2f", v.bytes * t / 1e9 / bandwidth);
      lroof = b;
      std::snprintf(b, sizeof b, "%.0f", bench::median(it->second.prefill_ms));
      lpre = b;
      std::snprintf(b, sizeof b, "%.2fx", tps / t);
      ratio = b;
      size_t k = 0;
      const auto& ot = v.run.ours.tokens;
      const auto& tt = it->second.tokens;
      while (k < ot.size() && k < tt.size() && ot[k] == tt[k]) ++k;
      same = "first " + std::to_string(k) + " of " + std::to_string(ot.size());
    }
    std::printf("| %-24s | %8.1f | %8.2f | %8.2f | %10.0f | %9s | %8s | %10s | %9s | %s |\n", v.label.c_str(),
                v.bytes / 1e6, tps, roof, bench::median(v.run.ours.prefill_ms), lt.c_str(), lroof.c_str(), lpre.c_str(),
                ratio.c_str(), same.c_str());
  }
  for (const auto& [f, e] : peer_error) std::printf("llama.cpp on %s: %s\n", f.c_str(), e.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  flex::keep_freed_memory();  // as the command line runs (design decisions 32, 53)
  if (argc == 4 && !std::strcmp(argv[1], "--write-child")) {
    const std::string name = argv[2];
    if (name == "gpt2") {
      bench::write_gpt2(argv[3], 12, 768, 12, 50257);
    } else {
      bench::write_random_model(argv[3], kLlama1B);
    }
    return 0;
  }
  Args a;
  try {
    if (!parse(argc, argv, a)) return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode: %s\n", e.what());
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  at::set_num_threads(a.threads);
  const bool only_gguf = a.models.size() == 1 && a.models[0] == "gguf";
  if (a.peers && !only_gguf && !fs::exists(a.python)) {
    std::fprintf(stderr, "bench_decode: no peer python at %s (bash scripts/golden/setup.sh; or --no-peers)\n",
                 a.python.c_str());
    return 2;
  }
  try {
    const double bw = read_bandwidth_gbs();
    for (const std::string& m : a.models) {
      if (m == "gguf") bench_gguf(a, bw);
      else bench_model(m, a, bw);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
