// Dataset-scale capture (flex/datasets/capture_dataset.h):
//  1. tokens/s of capture_dataset on a text corpus (GPT-2 tokenizer, one
//     residual-stream hook, GPT-2-small shape, context 128, batch 8) against
//     the plain forward of the same batches, interleaved (target >= 0.95),
//     and MB/s to disk;
//  2. the shard writer alone: MB/s of 1 GB of [1024, 768] batches through
//     ActivationShardWriter (copy into the reused shard buffer + write),
//     against a plain sequential write of the same bytes;
//  3. peak resident memory of a capture of ~100 MB and of >= 1 GB of
//     activations (a small model, several hooks), each in a fresh process:
//     bounded means the two peaks are close.
//
//   OMP_WAIT_POLICY=PASSIVE ./bench_dataset_capture [--rounds N] [--batches N]
#include "bench_util.h"

#include <flex/datasets/activation_shards.h>
#include <flex/datasets/capture_dataset.h>
#include <flex/flexcore/flex_model.h>
#include <flex/models/causal_lm.h>
#include <flex/tokenizers/tokenizer.h>

#include <cstring>
#include <fcntl.h>
#include <unistd.h>
#include <random>

namespace fs = std::filesystem;

namespace {

void write_corpus(const fs::path& path, int64_t words, uint32_t seed) {
  static const char* vocab[] = {"the", "model", "reads", "a", "long", "sentence", "about", "cats", "and", "rivers",
                                "in", "spring", "while", "people", "talk", "of", "numbers", "42", "tomorrow", "."};
  std::mt19937 rng(seed);
  std::ofstream out(path);
  for (int64_t w = 0; w < words;) {
    const int n = 20 + static_cast<int>(rng() % 200);
    for (int k = 0; k < n; ++k, ++w) out << (k ? " " : "") << vocab[rng() % 20];
    out << "\n";
  }
}

// Child: capture `tokens` tokens of random ids with a small model, print VmHWM (kB).
int rss_child(int64_t tokens) {
  const fs::path dir = bench::temp_dir("dataset_rss");
  bench::write_gpt2(dir / "model", 2, 256, 4, 256);
  flex::save_safetensors((dir / "ids.safetensors").string(),
                         {{"input_ids", at::randint(0, 256, {tokens}, at::kLong)}});
  auto model = flex::load_pretrained((dir / "model").string(), at::kFloat);
  flex::FlexModel fm(model);
  flex::DatasetCaptureOptions o;
  o.corpus.path = (dir / "ids.safetensors").string();
  o.corpus.context_len = 128;
  o.corpus.batch_size = 8;
  o.hooks = {"transformer.h.0", "transformer.h.1", "transformer.h.0.mlp.c_fc", "transformer.h.1.mlp.c_fc"};
  o.out_dir = (dir / "acts").string();
  o.max_shard_bytes = 64ull << 20;
  auto r = flex::capture_dataset(fm, nullptr, o);
  std::printf("%ld %llu %.2f\n", bench::status_kb("VmHWM"), static_cast<unsigned long long>(r.bytes_written), r.seconds);
  fs::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3, batches = 6;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batches")) batches = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--rss-child")) return rss_child(std::atoll(argv[i + 1]));
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  at::set_num_threads(2);
  const fs::path dir = bench::temp_dir("dataset_capture");
  bench::write_gpt2(dir / "model", 12, 768, 12, 50257);
  for (const char* f : {"vocab.json", "merges.txt"})
    fs::copy_file(fs::path(FLEX_SOURCE_DIR) / "tests/data/tokenizers/gpt2" / f, dir / "model" / f);
  std::ofstream(dir / "model/tokenizer_config.json") << R"({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})";
  write_corpus(dir / "corpus.txt", 400000, 1);

  auto model = flex::load_pretrained((dir / "model").string(), at::kFloat);
  auto tok = std::shared_ptr<const flex::Tokenizer>(flex::load_tokenizer((dir / "model").string()));
  const int64_t B = 8, T = 128;

  // The plain forward runs the very batches the capture packs.
  std::vector<at::Tensor> plain_batches;
  {
    flex::TokenContextsOptions c;
    c.path = (dir / "corpus.txt").string();
    c.context_len = T;
    c.batch_size = B;
    c.max_contexts = B * batches;
    flex::TokenContexts contexts(c, tok);
    while (auto b = contexts.next()) plain_batches.push_back(b->input_ids);
  }
  at::NoGradGuard no_grad;
  flex::FlexModel fm(model);
  flex::DatasetCaptureOptions o;
  o.corpus.path = (dir / "corpus.txt").string();
  o.corpus.context_len = T;
  o.corpus.batch_size = B;
  o.corpus.max_contexts = B * batches;
  o.hooks = {"transformer.h.6"};
  o.out_dir = (dir / "acts").string();
  flex::DatasetCaptureResult last;
  int run = 0;
  auto t = bench::interleaved(
      {[&] {
         for (const auto& ids : plain_batches) {
           flex::LMInputs in;
           in.input_ids = ids;
           (*model)(in.to_inputs());
         }
       },
       [&] {
         o.out_dir = (dir / ("acts" + std::to_string(run++))).string();
         last = flex::capture_dataset(fm, tok, o);
         fs::remove_all(o.out_dir);
       }},
      rounds, 1);
  const double tokens = double(B * T * batches);
  std::printf("dataset capture, GPT-2 small shape, text corpus (GPT-2 tokenizer), 1 hook (transformer.h.6), %lld x %lld, "
              "%d batches, %d threads, medians of %d rounds\n",
              static_cast<long long>(B), static_cast<long long>(T), batches, at::get_num_threads(), rounds);
  std::printf("  plain forward %.0f tokens/s, capture %.0f tokens/s, ratio %.3f (target >= 0.95); %.1f MB written, "
              "%.1f MB/s to disk\n",
              tokens / (t[0] / 1000), tokens / (t[1] / 1000), t[0] / t[1], last.bytes_written / 1e6,
              last.bytes_written / 1e6 / last.seconds);

  // The writer alone, against a plain write of the same bytes.
  {
    const int n = 340;  // x 3 MB: 1 GB
    const at::Tensor act = at::randn({1024, 768});
    const at::Tensor idx = at::arange(1024, at::kLong);
    auto t0 = std::chrono::steady_clock::now();
    uint64_t written = 0;
    {
      flex::ActivationShardWriter w((dir / "writer").string(), {{"hooks", {"h"}}});
      for (int i = 0; i < n; ++i) {
        flex::ActivationBatch b;
        b.first_context = i;
        b.end_context = i + 1;
        b.cursor = "{}";
        b.token_ids = b.document = b.position = b.context = b.offset = idx;
        b.activations = {act};
        w.add(std::move(b));
      }
      w.finish();
      written = w.bytes_written();
    }
    const double ws = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    {
      // What every shard does too: the data reaches the disk (fsync).
      const int fd = ::open((dir / "plain.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (int i = 0; i < n; ++i) {
        if (::write(fd, act.data_ptr(), act.numel() * 4) < 0) break;
        for (int k = 0; k < 5; ++k)
          if (::write(fd, idx.data_ptr(), idx.numel() * 8) < 0) break;
      }
      ::fsync(fd);
      ::close(fd);
    }
    const double ps = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  shard writer: %.0f MB in %.2f s = %.0f MB/s; plain sequential write + fsync %.0f MB/s (ratio %.2f)\n",
                written / 1e6, ws, written / 1e6 / ws, written / 1e6 / ps, ps / ws);
    fs::remove_all(dir / "writer");
    fs::remove(dir / "plain.bin");
  }

  // Peak memory against dataset size, each in a fresh process.
  const int64_t bytes_per_token = 4 * (256 + 256 + 1024 + 1024) + 40;
  for (double target : {100e6, 1.1e9}) {
    const int64_t tokens_n = static_cast<int64_t>(target / bytes_per_token) / 1024 * 1024;
    std::istringstream in(bench::run_child({"--rss-child", std::to_string(tokens_n)}));
    long hwm = 0;
    unsigned long long written = 0;
    double secs = 0;
    in >> hwm >> written >> secs;
    std::printf("  %.0f MB of activations (%lld tokens, 4 hooks, 64 MB shards): peak resident %.0f MB, %.0f MB/s\n",
                written / 1e6, static_cast<long long>(tokens_n), hwm / 1024.0, written / 1e6 / secs);
  }
  fs::remove_all(dir);
  return 0;
}
