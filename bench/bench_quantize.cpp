// Quantized weights on CPU: a generated Llama-shaped checkpoint (10 layers,
// 2048 wide, MLP 8192, 16/8 heads, vocab 16000: ~2.8 GB in float32) loaded
// as float32, as int8 and as nf4 (embeddings, norms and the head in bf16 for
// the quantized ones), each in its own spawned process: the bytes of the
// model's tensors, the process's resident memory after a forward, and the load
// time. Then the forward latency of the three, interleaved in one process.
// Last, the plan `flexmodel inspect --quantize nf4 --dtype bf16` makes for a
// Llama-3-8B config (module sizes on meta, no weights).
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_quantize [--iters N] [--threads T]
#include "bench_util.h"

#include <flex/dispatch/module_sizes.h>
#include <flex/hooks/empty_init.h>
#include <flex/models/from_pretrained.h>

#include <malloc.h>

#include <chrono>
#include <cstring>

namespace fs = std::filesystem;

namespace {

const char* kConfig = R"({"model_type": "llama", "vocab_size": 16000, "hidden_size": 2048, "num_hidden_layers": 10,
  "num_attention_heads": 16, "num_key_value_heads": 8, "intermediate_size": 8192, "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "torch_dtype": "float32"})";

// Llama-3-8B's shape.
const char* kLlama3 = R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "max_position_embeddings": 8192,
  "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";

flex::PretrainedOptions options(const std::string& method) {
  flex::PretrainedOptions o;
  if (method != "fp32") {
    o.quantization = flex::quantization_from_string(method, at::kBFloat16);
    o.torch_dtype = "bfloat16";
  }
  return o;
}

double tensor_bytes(flex::Module& m) {
  double b = 0;
  for (const auto& [name, t] : flex::state_dict(m)) b += static_cast<double>(t.nbytes());
  return b;
}

// Child: load `dir` as `method`, one forward; prints tensor bytes, RSS growth (kB) and load seconds.
int load_child(const std::string& dir, const std::string& method) {
  at::set_num_threads(2);
  const long base = bench::status_kb("RssAnon");
  const auto t0 = std::chrono::steady_clock::now();
  auto model = flex::from_pretrained(dir, options(method));
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  at::NoGradGuard ng;
  model->logits(at::randint(0, 16000, {1, 16}, at::kLong));
  ::malloc_trim(0);  // what the model holds, not what the allocator keeps from loading
  std::printf("%.0f %ld %.3f\n", tensor_bytes(*model), bench::status_kb("RssAnon") - base, load_s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && !std::strcmp(argv[1], "--load-child")) return load_child(argv[2], argv[3]);
  if (argc == 3 && !std::strcmp(argv[1], "--write-child")) {
    bench::write_random_model(argv[2], kConfig);  // in a child: its 2.8 GB leave with it
    return 0;
  }
  bench::ForwardArgs args;
  args.iters = 3;
  if (!bench::parse_forward_args(argc, argv, args)) return 2;
  const fs::path dir = bench::temp_dir("quantize");
  int rc = 0;
  try {
    bench::run_child({"--write-child", dir.string()});
    const double file_gb = fs::file_size(dir / "model.safetensors") / 1e9;
    std::printf("Llama-shaped checkpoint (10 x 2048, MLP 8192, vocab 16000): %.2f GB float32; quantized models keep "
                "embeddings, norms and lm_head in bf16\n",
                file_gb);
    std::printf("%-6s %14s %10s %16s %10s\n", "method", "tensor MB", "vs fp32", "anon MB after fwd", "load s");
    double fp32 = 0;
    for (const char* method : {"fp32", "int8", "nf4"}) {
      double bytes = 0, load_s = 0;
      long rss_kb = 0;
      const std::string out = bench::run_child({"--load-child", dir.string(), method});
      if (std::sscanf(out.c_str(), "%lf %ld %lf", &bytes, &rss_kb, &load_s) != 3)
        throw std::runtime_error("load child printed '" + out + "'");
      if (fp32 == 0) fp32 = bytes;
      std::printf("%-6s %14.1f %10.3f %16.1f %10.2f\n", method, bytes / 1e6, bytes / fp32, rss_kb / 1024.0, load_s);
      std::fflush(stdout);
    }
    {
      auto f = flex::from_pretrained(dir.string(), options("fp32"));
      auto i8 = flex::from_pretrained(dir.string(), options("int8"));
      auto n4 = flex::from_pretrained(dir.string(), options("nf4"));
      const at::Tensor ids = at::randint(0, 16000, {1, 16}, at::kLong);
      at::NoGradGuard ng;
      const auto t = bench::interleaved(
          {[&] { f->logits(ids); }, [&] { i8->logits(ids); }, [&] { n4->logits(ids); }}, args.iters, 1);
      std::printf("forward 1x16, %d threads, medians of %d interleaved rounds: fp32 %.0f ms, int8 %.0f ms (%.2fx), "
                  "nf4 %.0f ms (%.2fx)\n",
                  at::get_num_threads(), args.iters, t[0], t[1], t[1] / t[0], t[2], t[2] / t[0]);
    }
    // Llama-3-8B planned on meta: what inspect --quantize nf4 --dtype bf16 sizes.
    const fs::path cfg_dir = dir / "llama3-8b";
    fs::create_directories(cfg_dir);
    std::ofstream(cfg_dir / "config.json") << kLlama3;
    const flex::ModelConfig cfg = flex::load_config(cfg_dir.string());
    double whole = 0;
    {
      flex::EmptyInit scope(false);
      whole = flex::compute_module_sizes(*flex::build_causal_lm(cfg), at::kFloat).total();
    }
    std::shared_ptr<flex::CausalLM> planned;
    {
      flex::EmptyInit scope(false);
      planned = flex::build_causal_lm(cfg);
    }
    flex::plan_quantized_layers(*planned, cfg_dir.string(), flex::quantization_from_string("nf4", at::kBFloat16),
                                at::kBFloat16);
    const double nf4 = flex::compute_module_sizes(*planned, at::kBFloat16).total();
    std::printf("Llama-3-8B plan: fp32 %.2f GB, nf4 with bf16 embeddings/head %.2f GB = %.3f of fp32 (target <= 0.20)\n",
                whole / 1e9, nf4 / 1e9, nf4 / whole);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_quantize: %s\n", e.what());
    rc = 1;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return rc;
}
