// flexmodel capture --dataset: a corpus packed into contexts and captured as
// an activation dataset. Checked against independent computations: the
// packing redone here from the tokenizer, the activations of the same tokens
// captured with `capture --input-ids` (bitwise, fp32), a run killed at random
// moments and resumed equal to an uninterrupted one, and the reader's order.
#include "cli_util.h"
#include "hf_folder.h"

#include <flex/datasets/activation_shards.h>
#include <flex/dispatch/safetensors.h>
#include <flex/tokenizers/tokenizer.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "test_util.h"

using cli_test::run;
namespace fs = std::filesystem;

namespace {

/// A tiny GPT-2 folder whose tokenizer declares <|endoftext|> as its BOS.
const std::string& tiny_model() {
  static flex_test::TempDir dir;
  static const std::string path = dir.str("gpt2");
  static const bool made = [] {
    flex_examples::TinyGpt2Options o;
    o.n_layer = 2;
    o.seed = 11;
    flex_examples::write_tiny_gpt2(path, o);
    std::ofstream(path + "/tokenizer_config.json")
        << R"({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})" << "\n";
    return true;
  }();
  (void)made;
  return path;
}

const char* kWords[] = {"the", "sea", "cat", "in", "a", "hat", "on", "there", "sat", "runs", "blue", "stone"};

/// `lines` documents of 1..24 words (and a few blank lines, which are not documents).
std::vector<std::string> write_corpus(const std::string& path, int lines, uint32_t seed, bool jsonl = false) {
  std::mt19937 rng(seed);
  std::vector<std::string> docs;
  std::ofstream out(path);
  for (int i = 0; i < lines; ++i) {
    if (i % 17 == 5) out << "\n";
    std::string d;
    const int n = 1 + static_cast<int>(rng() % 24);
    for (int w = 0; w < n; ++w) d += (w ? " " : "") + std::string(kWords[rng() % 12]);
    docs.push_back(d);
    if (jsonl) out << nlohmann::json{{"id", i}, {"body", d}}.dump() << "\n";
    else out << d << "\n";
  }
  return docs;
}

/// The packing, redone here: BOS + tokens per document, concatenated, cut.
struct Packed {
  std::vector<int64_t> ids, doc, pos;  // whole contexts only
};
Packed pack(const std::vector<std::string>& docs, int64_t n) {
  auto tok = flex::load_tokenizer(tiny_model());
  Packed p;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int64_t> t = {flex_examples::tiny_eos_id()};
    for (int64_t id : tok->encode(docs[d], false)) t.push_back(id);
    for (size_t k = 0; k < t.size(); ++k) {
      p.ids.push_back(t[k]);
      p.doc.push_back(static_cast<int64_t>(d));
      p.pos.push_back(static_cast<int64_t>(k));
    }
  }
  const size_t whole = p.ids.size() / n * n;
  p.ids.resize(whole);
  p.doc.resize(whole);
  p.pos.resize(whole);
  return p;
}

at::Tensor as_tensor(const std::vector<int64_t>& v) { return at::tensor(v, at::kLong); }

/// Every tensor of a dataset, concatenated over its shards in order.
std::map<std::string, at::Tensor> read_all(const std::string& dir) {
  flex::ActivationDataset ds(dir);
  std::map<std::string, std::vector<at::Tensor>> parts;
  for (size_t s = 0; s < ds.num_shards(); ++s) {
    auto sh = ds.shard(s);
    for (auto& [k, t] : sh.activations) parts[k].push_back(t);
    parts["token_ids"].push_back(sh.token_ids);
    parts["document"].push_back(sh.document);
    parts["position"].push_back(sh.position);
    parts["context"].push_back(sh.context);
    parts["offset"].push_back(sh.offset);
  }
  std::map<std::string, at::Tensor> out;
  for (auto& [k, v] : parts) out[k] = at::cat(v, 0);
  return out;
}

std::string capture_input_ids(const std::string& tmp, const at::Tensor& ids, int64_t batch,
                              const std::vector<std::string>& hooks) {
  const std::string in = tmp + "/ids.safetensors", out = tmp + "/ref.safetensors";
  flex::save_safetensors(in, {{"input_ids", ids}});
  std::vector<std::string> args = {"capture", tiny_model(), "--input-ids", in, "--out", out,
                                   "--batch-size", std::to_string(batch)};
  for (const auto& h : hooks) args.insert(args.end(), {"--hook", h});
  auto r = run(args);
  EXPECT_EQ(r.code, 0) << r.err;
  return out;
}

}  // namespace

TEST(CliDataset, TextCorpusEqualsInputIdsCaptureAcrossShards) {
  flex_test::TempDir tmp;
  const auto docs = write_corpus(tmp.str("corpus.txt"), 120, 1);
  const int64_t n = 16, batch = 4;
  auto r = run({"capture", tiny_model(), "--dataset", tmp.str("corpus.txt"), "--context-len", "16", "--batch-size", "4",
                "--hook", "transformer.h.0", "--hook", "transformer.h.1.mlp", "--stream-dir", tmp.str("acts"),
                "--shard-size", "20KB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;

  const Packed p = pack(docs, n);
  const int64_t contexts = static_cast<int64_t>(p.ids.size()) / n;
  flex::ActivationDataset ds(tmp.str("acts"));
  EXPECT_GT(ds.num_shards(), 3u) << "the test needs several shards";
  EXPECT_EQ(ds.num_contexts(), contexts);
  auto got = read_all(tmp.str("acts"));
  ASSERT_TRUE(flex_test::equal(got["token_ids"], as_tensor(p.ids)));
  EXPECT_TRUE(flex_test::equal(got["document"], as_tensor(p.doc)));
  EXPECT_TRUE(flex_test::equal(got["position"], as_tensor(p.pos)));
  EXPECT_TRUE(flex_test::equal(got["context"], at::arange(contexts, at::kLong).repeat_interleave(n)));
  EXPECT_TRUE(flex_test::equal(got["offset"], at::arange(n, at::kLong).repeat({contexts})));

  // The same tokens through `capture --input-ids`, in the same batches.
  const std::vector<std::string> hooks = {"transformer.h.0", "transformer.h.1.mlp"};
  auto ref = flex::SafetensorsFile::open(
      capture_input_ids(tmp.str(""), as_tensor(p.ids).reshape({contexts, n}), batch, hooks));
  for (const auto& h : hooks) {
    at::Tensor want = ref->get(h).reshape({contexts * n, -1});
    EXPECT_TRUE(flex_test::equal(got[h], want)) << h << ": max diff " << (got[h] - want).abs().max().item<float>();
  }

  // The files themselves: the documented names and metadata.
  auto first = flex::SafetensorsFile::open(tmp.str("acts/shard-00000.safetensors"));
  EXPECT_EQ(first->metadata().at("flexmodel.first_context"), "0");
  EXPECT_EQ(first->info("transformer.h.0").dtype_name, "F32");
  EXPECT_EQ(first->info("transformer.h.0").shape.at(1), 64);
  const auto settings = nlohmann::json::parse(cli_test::slurp(tmp.str("acts/dataset.json")));
  EXPECT_EQ(settings["context_len"], 16);
  EXPECT_EQ(settings["shapes"]["transformer.h.1.mlp"], nlohmann::json::array({64}));

  // Run again: everything is there, nothing is added.
  r = run({"capture", tiny_model(), "--dataset", tmp.str("corpus.txt"), "--context-len", "16", "--batch-size", "4",
           "--hook", "transformer.h.0", "--hook", "transformer.h.1.mlp", "--stream-dir", tmp.str("acts"),
           "--shard-size", "20KB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(flex::ActivationDataset(tmp.str("acts")).num_shards(), ds.num_shards());
  // ... and a different setting into the same directory is refused, naming it.
  r = run({"capture", tiny_model(), "--dataset", tmp.str("corpus.txt"), "--context-len", "32", "--hook",
           "transformer.h.0", "--hook", "transformer.h.1.mlp", "--stream-dir", tmp.str("acts")});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("context_len"), std::string::npos) << r.err;
}

TEST(CliDataset, JsonLinesRandomPositionsWithoutBosInBf16) {
  flex_test::TempDir tmp;
  const auto docs = write_corpus(tmp.str("corpus.jsonl"), 60, 2, /*jsonl=*/true);
  const int64_t n = 32, k = 5;
  auto args = std::vector<std::string>{"capture", tiny_model(), "--dataset", tmp.str("corpus.jsonl"), "--text-field",
                                       "body", "--context-len", "32", "--batch-size", "3", "--positions", "random:5",
                                       "--exclude-bos", "--hook", "transformer.h.1", "--stream-dir", tmp.str("a"),
                                       "--store-dtype", "bf16", "--shard-size", "4KB"};
  auto r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  const Packed p = pack(docs, n);
  const int64_t contexts = static_cast<int64_t>(p.ids.size()) / n;
  auto got = read_all(tmp.str("a"));
  ASSERT_EQ(got["token_ids"].size(0), contexts * k);
  EXPECT_EQ(got["transformer.h.1"].scalar_type(), at::kBFloat16);
  const at::Tensor ids = as_tensor(p.ids);
  // k distinct ascending offsets per context, none of them a BOS; ids and
  // indices where the packing puts them.
  std::set<std::vector<int64_t>> draws;
  for (int64_t c = 0; c < contexts; ++c) {
    at::Tensor ctx = got["context"].narrow(0, c * k, k), off = got["offset"].narrow(0, c * k, k);
    EXPECT_TRUE(flex_test::equal(ctx, at::full({k}, c, at::kLong)));
    std::vector<int64_t> o(off.data_ptr<int64_t>(), off.data_ptr<int64_t>() + k);
    EXPECT_TRUE(std::is_sorted(o.begin(), o.end()) && std::adjacent_find(o.begin(), o.end()) == o.end());
    draws.insert(o);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t flat = c * n + o[j];
      EXPECT_NE(p.ids[flat], flex_examples::tiny_eos_id());
      EXPECT_EQ(got["token_ids"][c * k + j].item<int64_t>(), p.ids[flat]);
      EXPECT_EQ(got["document"][c * k + j].item<int64_t>(), p.doc[flat]);
      EXPECT_EQ(got["position"][c * k + j].item<int64_t>(), p.pos[flat]);
    }
  }
  EXPECT_GT(draws.size(), static_cast<size_t>(contexts / 2)) << "the draws should differ between contexts";

  // The stored rows are the bf16 of the fp32 activations of those tokens.
  auto ref = flex::SafetensorsFile::open(capture_input_ids(tmp.str(""), ids.reshape({contexts, n}), 3, {"transformer.h.1"}));
  at::Tensor all = ref->get("transformer.h.1").reshape({contexts * n, -1});
  at::Tensor rows = got["context"] * n + got["offset"];
  const at::Tensor want = all.index_select(0, rows);
  EXPECT_TRUE(flex_test::equal(got["transformer.h.1"], want.to(at::kBFloat16)))
      << (got["transformer.h.1"].to(at::kFloat) - want).abs().max().item<float>();

  // The same draw with another batch size (the generator is per context).
  args[9] = "7";
  args[16] = tmp.str("b");
  r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(flex_test::equal(read_all(tmp.str("b"))["offset"], got["offset"]));
}

TEST(CliDataset, TokenIdCorpora) {
  flex_test::TempDir tmp;
  const int64_t V = flex_examples::tiny_vocab_size();
  // [documents, tokens] rows, taken as they are (no BOS added).
  at::Tensor rows = at::randint(0, V - 1, {9, 20}, at::kLong);
  flex::save_safetensors(tmp.str("rows.safetensors"), {{"input_ids", rows.to(at::kInt)}});
  auto r = run({"capture", tiny_model(), "--dataset", tmp.str("rows.safetensors"), "--context-len", "24", "--hook",
                "transformer.h.0.ln_1", "--stream-dir", tmp.str("r")});
  ASSERT_EQ(r.code, 0) << r.err;
  auto got = read_all(tmp.str("r"));
  const int64_t whole = 180 / 24 * 24;
  EXPECT_TRUE(flex_test::equal(got["token_ids"], rows.reshape({-1}).narrow(0, 0, whole)));
  EXPECT_TRUE(flex_test::equal(got["document"], at::arange(9, at::kLong).repeat_interleave(20).narrow(0, 0, whole)));
  EXPECT_TRUE(flex_test::equal(got["position"], at::arange(20, at::kLong).repeat({9}).narrow(0, 0, whole)));

  // A 1-D stream is one document; --max-tokens rounds up to whole contexts.
  at::Tensor stream = at::randint(0, V - 1, {500}, at::kLong);
  flex::save_safetensors(tmp.str("stream.safetensors"), {{"input_ids", stream}});
  r = run({"capture", tiny_model(), "--dataset", tmp.str("stream.safetensors"), "--context-len", "50", "--max-tokens",
           "120", "--hook", "transformer.h.0", "--stream-dir", tmp.str("s")});
  ASSERT_EQ(r.code, 0) << r.err;
  got = read_all(tmp.str("s"));
  EXPECT_TRUE(flex_test::equal(got["token_ids"], stream.narrow(0, 0, 150)));
  EXPECT_TRUE(flex_test::equal(got["position"], at::arange(150, at::kLong)));

  // Ids outside the vocabulary: a ConfigError naming the dataset, not a crash.
  flex::save_safetensors(tmp.str("bad.safetensors"), {{"input_ids", at::full({64}, V + 3, at::kLong)}});
  r = run({"capture", tiny_model(), "--dataset", tmp.str("bad.safetensors"), "--context-len", "8", "--hook",
           "transformer.h.0", "--stream-dir", tmp.str("bad")});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("bad.safetensors"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("vocabulary"), std::string::npos) << r.err;
}

TEST(CliDataset, MistakesAreTypedErrors) {
  flex_test::TempDir tmp;
  write_corpus(tmp.str("c.txt"), 20, 3);
  std::ofstream(tmp.str("c.jsonl")) << R"({"text": "the sea"})" << "\n" << R"({"body": "a cat"})" << "\n";
  const std::string m = tiny_model(), c = tmp.str("c.txt");
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string says;
  } cases[] = {
      {{"--dataset", c, "--hook", "transformer.h.0", "--stream-dir", tmp.str("x")}, 2, "--context-len"},
      {{"--dataset", c, "--context-len", "8", "--hook", "transformer.h.0"}, 2, "--stream-dir"},
      {{"--dataset", c, "--context-len", "8", "--hook", "transformer.h.0", "--stream-dir", tmp.str("x"), "--positions",
        "some"},
       2, "random:K"},
      {{"--dataset", c, "--context-len", "8", "--hook", "transformer.h.0", "--stream-dir", tmp.str("x"), "--out", "o"},
       2, "--out"},
      {{"--prompt", "a", "--context-len", "8", "--hook", "transformer.h.0", "--out", tmp.str("o.safetensors")},
       2, "--dataset"},
      {{"--dataset", tmp.str("none.txt"), "--context-len", "8", "--hook", "transformer.h.0", "--stream-dir", tmp.str("x")},
       1, "none.txt"},
      {{"--dataset", tmp.str("c.jsonl"), "--context-len", "2", "--hook", "transformer.h.0", "--stream-dir", tmp.str("y")},
       1, "document 1"},
      {{"--dataset", c, "--context-len", "8", "--hook", "transformer.h.0.attn.hook_attn_probs", "--stream-dir",
        tmp.str("z")},
       1, "one row per token"},
      {{"--dataset", c, "--context-len", "8", "--hook", "transformer.h.9", "--stream-dir", tmp.str("w")}, 1,
       "transformer.h.9"},
  };
  for (const auto& k : cases) {
    std::vector<std::string> a = {"capture", m};
    a.insert(a.end(), k.args.begin(), k.args.end());
    auto r = run(a);
    EXPECT_EQ(r.code, k.code) << a[3] << " " << r.err;
    EXPECT_NE(r.err.find(k.says), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(tmp.str("z/shard-00000.safetensors")));
}

// --- killed and resumed ------------------------------------------------------------------


TEST(CliDataset, KilledAtRandomMomentsResumesToTheUninterruptedDataset) {
  flex_test::TempDir tmp;
  write_corpus(tmp.str("c.txt"), 4000, 4);
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"capture", tiny_model(), "--dataset", tmp.str("c.txt"), "--context-len", "32",
                                    "--batch-size", "8", "--hook", "transformer.h.0", "--hook", "transformer.h.1.attn",
                                    "--stream-dir", out, "--shard-size", "256KB"};
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run(args(tmp.str("clean")));
  ASSERT_EQ(r.code, 0) << r.err;
  const int run_ms = static_cast<int>(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());

  std::mt19937 rng(99);
  std::vector<int64_t> progress;
  int killed = 0;
  for (int k = 0; k < 4; ++k) {
    const pid_t pid = cli_test::spawn_flexmodel(args(tmp.str("killed")), tmp.str("err.txt"));
    // Between a tenth and a quarter of a whole run: four kills cannot add up to one.
    std::this_thread::sleep_for(std::chrono::milliseconds(run_ms / 10 + static_cast<int>(rng() % (run_ms / 7 + 1))));
    ::kill(pid, SIGKILL);
    const int st = cli_test::wait_for(pid);
    if (WIFSIGNALED(st)) ++killed;
    else ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << cli_test::slurp(tmp.str("err.txt"));
    if (fs::exists(tmp.str("killed/dataset.json"))) progress.push_back(flex::ActivationDataset(tmp.str("killed")).num_contexts());
  }
  EXPECT_EQ(killed, 4) << "the kills should land while the capture runs";
  for (size_t i = 1; i < progress.size(); ++i) EXPECT_GE(progress[i], progress[i - 1]);
  r = run(args(tmp.str("killed")));
  ASSERT_EQ(r.code, 0) << r.err;
  if (!progress.empty() && progress.back() > 0) {
    EXPECT_NE(r.err.find("resumed"), std::string::npos) << r.err;
  }

  auto want = read_all(tmp.str("clean")), got = read_all(tmp.str("killed"));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, t] : want) EXPECT_TRUE(flex_test::equal(got[key], t)) << key;
  for (const auto& e : fs::directory_iterator(tmp.str("killed")))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// --- the reader --------------------------------------------------------------------------

TEST(ActivationLoader, InOrderAndShuffledVisitEveryTokenOnce) {
  flex_test::TempDir tmp;
  write_corpus(tmp.str("c.txt"), 300, 5);
  auto r = run({"capture", tiny_model(), "--dataset", tmp.str("c.txt"), "--context-len", "16", "--hook",
                "transformer.h.0", "--stream-dir", tmp.str("d"), "--shard-size", "16KB"});
  ASSERT_EQ(r.code, 0) << r.err;
  flex::ActivationDataset ds(tmp.str("d"));
  ASSERT_GT(ds.num_shards(), 4u);
  auto all = read_all(tmp.str("d"));
  const at::Tensor key = all["context"] * 16 + all["offset"];  // a token's place in the dataset

  flex::ActivationLoaderOptions o;
  o.batch_tokens = 100;
  auto ordered = ds.loader(o);
  std::vector<at::Tensor> keys, acts;
  while (auto b = ordered.next()) {
    EXPECT_LE(b->size(), 100);
    keys.push_back(b->context * 16 + b->offset);
    acts.push_back(b->activations.at("transformer.h.0"));
  }
  EXPECT_TRUE(flex_test::equal(at::cat(keys), key));
  EXPECT_TRUE(flex_test::equal(at::cat(acts), all["transformer.h.0"]));

  auto shuffled_keys = [&](uint64_t seed) {
    o.shuffle = true;
    o.seed = seed;
    auto l = ds.loader(o);
    std::vector<at::Tensor> k;
    while (auto b = l.next()) {
      // Each row keeps its own activation.
      at::Tensor place = b->context * 16 + b->offset;
      EXPECT_TRUE(
          flex_test::equal(b->activations.at("transformer.h.0"), all["transformer.h.0"].index_select(0, place)));
      k.push_back(place);
    }
    return at::cat(k);
  };
  at::Tensor s1 = shuffled_keys(1), s1b = shuffled_keys(1), s2 = shuffled_keys(2);
  EXPECT_TRUE(flex_test::equal(std::get<0>(s1.sort()), key)) << "every token exactly once";
  EXPECT_FALSE(at::equal(s1, key)) << "shuffled";
  EXPECT_TRUE(flex_test::equal(s1, s1b)) << "same seed, same order";
  EXPECT_FALSE(at::equal(s1, s2));
}

// --- every architecture ------------------------------------------------------------------

TEST(CliDataset, EveryFixtureArchitectureEqualsItsInputIdsCapture) {
  // Dense and mixture-of-experts models: a block's output (and a router's
  // logits, [B*T, experts]) stored per token equal `capture --input-ids` of
  // the same contexts, bitwise.
  struct Arch {
    std::string model;
    std::vector<std::string> hooks;
  } archs[] = {
      {"gpt2", {"transformer.h.1"}},
      {"gpt-neox", {"gpt_neox.layers.0"}},
      {"llama", {"model.layers.1"}},
      {"gemma2", {"model.layers.0"}},
      {"phi3", {"model.layers.0.mlp"}},
      {"olmo2", {"model.layers.0"}},
      {"qwen2", {"model.layers.0"}},
      {"mixtral", {"model.layers.0", "model.layers.0.mlp.gate"}},
      {"qwen2_moe", {"model.layers.0.mlp.gate", "model.layers.1"}},
  };
  flex_test::TempDir tmp;
  at::manual_seed(3);
  const at::Tensor stream = at::randint(0, 256, {6 * 12}, at::kLong);
  flex::save_safetensors(tmp.str("ids.safetensors"), {{"input_ids", stream}});
  for (const auto& a : archs) {
    const std::string model = flex_test::fixture("models/" + a.model), out = tmp.str("acts-" + a.model);
    std::vector<std::string> args = {"capture", model, "--dataset", tmp.str("ids.safetensors"), "--context-len", "12",
                                     "--batch-size", "3", "--stream-dir", out};
    std::vector<std::string> ref_args = {"capture", model, "--input-ids", tmp.str("ctx.safetensors"), "--batch-size",
                                         "3", "--out", tmp.str("ref.safetensors")};
    for (const auto& h : a.hooks) {
      args.insert(args.end(), {"--hook", h});
      ref_args.insert(ref_args.end(), {"--hook", h});
    }
    auto r = run(args);
    ASSERT_EQ(r.code, 0) << a.model << ": " << r.err;
    flex::save_safetensors(tmp.str("ctx.safetensors"), {{"input_ids", stream.reshape({6, 12})}});
    r = run(ref_args);
    ASSERT_EQ(r.code, 0) << a.model << ": " << r.err;
    auto got = read_all(out);
    auto ref = flex::SafetensorsFile::open(tmp.str("ref.safetensors"));
    EXPECT_TRUE(flex_test::equal(got["token_ids"], stream)) << a.model;
    for (const auto& h : a.hooks) {
      at::Tensor want = ref->get(h);
      want = want.reshape({72, want.numel() / 72});
      EXPECT_TRUE(flex_test::equal(got[h].reshape({72, -1}), want)) << a.model << " " << h;
    }
  }
}

TEST(CliDataset, OffloadedToDiskGivesTheSameDataset) {
  // Half the model's bytes on the CPU, the rest on disk (auto map): the
  // weights are the same, so the activations are bitwise the same.
  flex_test::TempDir tmp;
  const std::string model = flex_test::fixture("models/llama");
  at::manual_seed(5);
  flex::save_safetensors(tmp.str("ids.safetensors"), {{"input_ids", at::randint(0, 256, {4, 30}, at::kLong)}});
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"capture", model, "--dataset", tmp.str("ids.safetensors"), "--context-len", "10",
                                    "--hook", "model.layers.1", "--hook", "model.layers.0.mlp", "--stream-dir", out};
  };
  auto r = run(args(tmp.str("plain")));
  ASSERT_EQ(r.code, 0) << r.err;
  int64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(model))
    if (e.path().extension() == ".safetensors") bytes += static_cast<int64_t>(fs::file_size(e.path()));
  auto a = args(tmp.str("offloaded"));
  a.insert(a.end(), {"--device-map", "auto", "--max-memory", "cpu=" + std::to_string(bytes / 2), "--offload-folder",
                     tmp.str("off")});
  r = run(a);
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_FALSE(fs::is_empty(tmp.str("off"))) << "some weights should be on disk";
  auto want = read_all(tmp.str("plain")), got = read_all(tmp.str("offloaded"));
  for (const auto& [k, t] : want) EXPECT_TRUE(flex_test::equal(got[k], t)) << k;
}
