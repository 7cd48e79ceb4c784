// flexmodel train-sae on a synthetic activation dataset whose tokens are
// sparse combinations of known directions: the trained TopK SAE explains
// the held-out tokens (measured here with flex::load_sae, not the run's own
// numbers), a run killed with SIGKILL and rerun ends with the same weights
// and metrics as an uninterrupted one, a transcoder learns a linear map, and
// bad input gets typed errors that leave the last checkpoint intact. Trained
// on the fly from a tiny GPT-2's forward (--model), a killed and rerun run
// also ends as the uninterrupted one, and eval.json holds the next-token losses.
#include "cli_util.h"
#include "hf_folder.h"

#include <flex/datasets/activation_shards.h>
#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>
#include <flex/sae/load_sae.h>
#include <flex/sae/splice.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tensor_compare.h"
#include "test_util.h"

namespace fs = std::filesystem;
using cli_test::run;

namespace {

constexpr int64_t kWidth = 32, kAtoms = 96, kTokens = 48000;

// Shards of `tokens` rows: hook "blocks.0.hook_resid_post" holds sums of 3 of
// kAtoms unit directions with weights in [0.5, 2] (plus small noise), and
// "blocks.0.hook_mlp_out" a fixed linear map of it.
void write_dataset(const std::string& dir) {
  at::manual_seed(3);
  const at::Tensor atoms = at::randn({kAtoms, kWidth});
  const at::Tensor dirs = atoms / atoms.norm(2, {1}, true);
  const at::Tensor map = at::randn({kWidth, 24}) / std::sqrt(static_cast<double>(kWidth));
  flex::ActivationShardWriterOptions wo;
  wo.max_shard_bytes = 1 << 20;
  flex::ActivationShardWriter w(dir, {{"hooks", {"blocks.0.hook_resid_post", "blocks.0.hook_mlp_out"}},
                                      {"model", "synthetic"}, {"context_len", 64}},
                                wo);
  const int64_t per = 1000;
  for (int64_t b = 0; b < kTokens / per; ++b) {
    const at::Tensor pick = at::randint(kAtoms, {per, 3});
    const at::Tensor weight = at::rand({per, 3}) * 1.5 + 0.5;
    const at::Tensor x = (dirs.index_select(0, pick.flatten()).view({per, 3, kWidth}) * weight.unsqueeze(-1)).sum(1) +
                         0.01 * at::randn({per, kWidth});
    flex::ActivationBatch batch;
    batch.first_context = b;
    batch.end_context = b + 1;
    batch.cursor = "{}";
    batch.token_ids = at::arange(per, at::kLong);
    batch.document = at::full({per}, b, at::kLong);
    batch.position = at::arange(per, at::kLong);
    batch.context = at::full({per}, b, at::kLong);
    batch.offset = at::arange(per, at::kLong);
    batch.activations = {x, at::matmul(x, map)};
    w.add(batch);
  }
  w.finish();
}

const std::string& dataset() {
  static flex_test::TempDir dir;
  static const std::string path = [] {
    const std::string p = dir.str("acts");
    write_dataset(p);
    return p;
  }();
  return path;
}

std::vector<std::string> topk_args(const std::string& out, int64_t total = 192000) {
  return {"train-sae", "--activations", dataset(), "--hook", "blocks.0.hook_resid_post", "--architecture", "topk",
          "--d-sae", "256", "--k", "4", "--lr", "0.01", "--batch-tokens", "256", "--total-tokens",
          std::to_string(total), "--eval-tokens", "4000", "--seed", "7", "--out", out};
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::map<std::string, at::Tensor> weights(const std::string& dir) {
  auto f = flex::SafetensorsFile::open(dir + "/sae_weights.safetensors");
  std::map<std::string, at::Tensor> out;
  for (const auto& n : f->names()) out[n] = f->get(n).clone();
  return out;
}

// The dataset's last `n` rows of a hook (the held-out tail), read directly.
at::Tensor tail(const std::string& hook, int64_t n) {
  flex::ActivationDataset ds(dataset());
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < ds.num_shards(); ++i) parts.push_back(ds.shard(i).activations.at(hook));
  const at::Tensor all = at::cat(parts);
  return all.narrow(0, all.size(0) - n, n).to(at::kFloat);
}

// Kills `args` once a checkpoint past `first` exists, reruns it, and expects
// the uninterrupted run's weights and metrics (in `clean`).
void kill_rerun_and_compare(const std::vector<std::string>& args, const std::string& killed, const std::string& clean,
                            const std::string& err, const std::string& first) {
  const pid_t pid = cli_test::spawn_flexmodel(args, err);
  bool seen = false;
  for (int i = 0; i < 60000 && !seen; ++i) {
    if (fs::exists(killed + "/checkpoints"))
      for (const auto& e : fs::directory_iterator(killed + "/checkpoints"))
        if (e.path().filename().string() != first && e.path().filename().string().rfind("step-", 0) == 0) seen = true;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(pid, SIGKILL);
  const int st = cli_test::wait_for(pid);
  ASSERT_TRUE(seen) << cli_test::slurp(err);
  ASSERT_TRUE(WIFSIGNALED(st)) << "the run ended before the kill";
  const auto r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("resumed at step"), std::string::npos) << r.err;
  const auto want = weights(clean), got = weights(killed);
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, t] : want) EXPECT_TRUE(flex_test::equal(got.at(name), t)) << name;
  EXPECT_EQ(cli_test::slurp(killed + "/metrics.jsonl"), cli_test::slurp(clean + "/metrics.jsonl"));
}

}  // namespace

TEST(CliTrainSae, TopKExplainsHeldOutTokensAndIsReadBackInSaeLensFormat) {
  flex_test::TempDir tmp;
  const auto r = run(topk_args(tmp.str("sae")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("flexmodel: trained topk"), std::string::npos) << r.err;
  // The dictionary on disk, read as any SAELens folder, on the held-out rows.
  auto sae = flex::load_sae(tmp.str("sae"));
  EXPECT_EQ(sae->config().class_name(), "TopKSAE");
  EXPECT_EQ(sae->config().hook_name, "blocks.0.hook_resid_post");
  const at::Tensor x = tail("blocks.0.hook_resid_post", 4000);
  at::NoGradGuard ng;
  const at::Tensor y = sae->decode(sae->encode(x));
  const double ev = 1.0 - (y - x).pow(2).sum().item<double>() / (x - x.mean(0)).pow(2).sum().item<double>();
  EXPECT_GE(ev, 0.9) << "explained variance of the held-out tokens at k = 4";
  const auto eval = read_json(tmp.str("sae/eval.json"));
  EXPECT_NEAR(eval.at("explained_variance").get<double>(), ev, 1e-4);
  EXPECT_EQ(eval.at("l0").get<double>(), 4.0);
  // One metrics line per step, tokens counting up; curves and a checkpoint beside them.
  std::ifstream m(tmp.str("sae/metrics.jsonl"));
  std::string line;
  int64_t steps = 0;
  while (std::getline(m, line)) {
    const auto j = nlohmann::json::parse(line);
    ++steps;
    EXPECT_EQ(j.at("step").get<int64_t>(), steps);
    EXPECT_EQ(j.at("tokens").get<int64_t>(), steps * 256);
    for (const char* k : {"loss", "mse", "l0", "explained_variance", "dead_fraction", "lr"}) EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(steps, 192000 / 256);
  const std::string svg = cli_test::slurp(tmp.str("sae/curves.svg"));
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_TRUE(fs::exists(tmp.str("sae/checkpoints/step-750/cfg.json")));
  EXPECT_TRUE(fs::exists(tmp.str("sae/checkpoints/step-750/trainer_state.safetensors")));
}

TEST(CliTrainSae, KilledAndRerunEndsWithTheUninterruptedWeights) {
  flex_test::TempDir tmp;
  auto args = [&](const std::string& out) {
    auto a = topk_args(out, 256 * 600);
    a.insert(a.end(), {"--checkpoint-every", std::to_string(256 * 40)});
    return a;
  };
  auto r = run(args(tmp.str("clean")));
  ASSERT_EQ(r.code, 0) << r.err;
  kill_rerun_and_compare(args(tmp.str("killed")), tmp.str("killed"), tmp.str("clean"), tmp.str("err.txt"), "step-40");
}

TEST(CliTrainSae, JumpReLUSkipTranscoderLearnsTheMap) {
  flex_test::TempDir tmp;
  const auto r = run({"train-sae", "--activations", dataset(), "--hook", "blocks.0.hook_resid_post", "--transcoder-out",
                      "blocks.0.hook_mlp_out", "--skip", "--architecture", "jumprelu", "--d-sae", "64",
                      "--l0-coefficient", "0.001", "--lr", "0.005", "--batch-tokens", "256", "--total-tokens", "51200",
                      "--eval-tokens", "4000", "--out", tmp.str("tc")});
  ASSERT_EQ(r.code, 0) << r.err;
  auto tc = flex::load_sae(tmp.str("tc"));
  EXPECT_EQ(tc->config().class_name(), "JumpReLUSkipTranscoder");
  EXPECT_EQ(tc->config().hook_name_out, "blocks.0.hook_mlp_out");
  const at::Tensor x = tail("blocks.0.hook_resid_post", 4000), y = tail("blocks.0.hook_mlp_out", 4000);
  at::NoGradGuard ng;
  const at::Tensor p = (*tc)(x);
  const double ev = 1.0 - (p - y).pow(2).sum().item<double>() / (y - y.mean(0)).pow(2).sum().item<double>();
  EXPECT_GE(ev, 0.9);
}

// The first step of a run started --from-pretrained sees the dictionary it
// started from: its explained variance on that batch is the one eval.json
// measured on held-out tokens, where a random start explains little.
TEST(CliTrainSae, FromPretrainedStartsWhereTheDictionaryLeftOff) {
  flex_test::TempDir tmp;
  auto r = run(topk_args(tmp.str("first"), 256 * 120));
  ASSERT_EQ(r.code, 0) << r.err;
  const double trained = read_json(tmp.str("first/eval.json")).at("explained_variance").get<double>();
  ASSERT_GT(trained, 0.6);
  auto first_ev = [&](const std::string& dir) {
    std::ifstream m(dir + "/metrics.jsonl");
    std::string line;
    std::getline(m, line);
    return nlohmann::json::parse(line).at("explained_variance").get<double>();
  };
  auto more = topk_args(tmp.str("second"), 256 * 4);
  more[std::find(more.begin(), more.end(), "--seed") - more.begin() + 1] = "8";
  more.insert(more.end(), {"--from-pretrained", tmp.str("first")});
  r = run(more);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NEAR(first_ev(tmp.str("second")), trained, 0.05);
  EXPECT_LT(first_ev(tmp.str("first")), trained - 0.3) << "a random start explains as much as the trained dictionary";
  // Another architecture: a typed error naming the dictionary and the field.
  auto jump = more;
  jump[std::find(jump.begin(), jump.end(), "topk") - jump.begin()] = "jumprelu";
  jump.erase(std::find(jump.begin(), jump.end(), "--k"), std::find(jump.begin(), jump.end(), "--k") + 2);
  jump[std::find(jump.begin(), jump.end(), "--out") - jump.begin() + 1] = tmp.str("third");
  r = run(jump);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(tmp.str("first")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the architecture is TopKSAE, this run needs JumpReLUSAE"), std::string::npos) << r.err;
}

TEST(CliTrainSae, BadInputIsATypedErrorAndKeepsTheLastCheckpoint) {
  flex_test::TempDir tmp;
  auto r = run({"train-sae", "--activations", dataset(), "--hook", "blocks.3.hook_resid_post", "--architecture", "topk",
                "--d-sae", "64", "--total-tokens", "1024", "--out", tmp.str("a")});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("no hook 'blocks.3.hook_resid_post'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("blocks.0.hook_resid_post"), std::string::npos) << r.err;
  r = run({"train-sae", "--activations", dataset(), "--hook", "blocks.0.hook_resid_post", "--architecture", "topk",
           "--d-sae", "64", "--k", "65", "--batch-tokens", "256", "--total-tokens", "1024", "--out", tmp.str("b")});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("k = 65"), std::string::npos) << r.err;
  // A rerun into a folder trained with other settings.
  r = run(topk_args(tmp.str("c"), 2048));
  ASSERT_EQ(r.code, 0) << r.err;
  auto other = topk_args(tmp.str("c"), 2048);
  other[std::find(other.begin(), other.end(), "--d-sae") - other.begin() + 1] = "192";
  r = run(other);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("other settings (sae.d_sae differs"), std::string::npos) << r.err;
  // A learning rate that diverges: stops with the step, the checkpoint before it stays whole.
  auto bad = topk_args(tmp.str("d"), 256 * 400);
  bad[std::find(bad.begin(), bad.end(), "--lr") - bad.begin() + 1] = "1e30";
  bad.insert(bad.end(), {"--checkpoint-every", "256"});
  r = run(bad);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(r.err.find("the loss is") != std::string::npos || r.err.find("turned NaN or infinite") != std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("last good checkpoint"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp.str("d/sae_weights.safetensors")));
  for (const auto& e : fs::directory_iterator(tmp.str("d/checkpoints"))) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos) << e.path();
    auto sae = flex::load_sae(e.path().string());  // whole, and every weight finite (the loader checks)
    EXPECT_EQ(sae->config().d_sae, 256);
  }
}


TEST(CliTrainSae, OnTheFlyFromTheModelResumesExactlyAndReportsTheNextTokenLoss) {
  flex_test::TempDir tmp;
  flex_examples::TinyGpt2Options mo;
  mo.n_layer = 2;
  mo.seed = 4;
  flex_examples::write_tiny_gpt2(tmp.str("gpt2"), mo);
  at::manual_seed(9);
  flex::save_safetensors(tmp.str("ids.safetensors"),
                         {{"input_ids", at::randint(flex_examples::tiny_vocab_size(), {96, 40}, at::kLong)}});
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"train-sae", "--model", tmp.str("gpt2"), "--dataset", tmp.str("ids.safetensors"),
                                    "--context-len", "16", "--batch-size", "4", "--buffer-tokens", "512",
                                    "--hook", "blocks.1.hook_resid_pre", "--architecture", "topk", "--d-sae", "64",
                                    "--k", "4", "--lr", "0.003", "--batch-tokens", "96", "--total-tokens",
                                    std::to_string(96 * 200), "--checkpoint-every", std::to_string(96 * 20),
                                    "--eval-tokens", "256", "--seed", "3", "--out", out};
  };
  const auto r = run(args(tmp.str("clean")));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("CE loss recovered"), std::string::npos) << r.err;
  const auto ev = read_json(tmp.str("clean/eval.json"));
  for (const char* k : {"next_token_loss_clean", "next_token_loss_with_sae", "next_token_loss_zeroed", "ce_loss_recovered"})
    EXPECT_TRUE(ev.contains(k) && std::isfinite(ev.at(k).get<double>())) << k;
  EXPECT_EQ(ev.at("tokens").get<int64_t>(), 256);
  auto sae = flex::load_sae(tmp.str("clean"));
  EXPECT_EQ(sae->config().hook_name, "blocks.1.hook_resid_pre");
  kill_rerun_and_compare(args(tmp.str("killed")), tmp.str("killed"), tmp.str("clean"), tmp.str("err.txt"), "step-20");
}

// cfg.json's metadata names the hook as TransformerLens does (what SAELens and Neuronpedia look up) and the model by
// its name: trained from a dataset captured under module names (a block's output: blocks.0.hook_resid_post; the
// model named by its folder), and on the fly from the model (a hook point: blocks.1.hook_resid_pre; the model named
// by config.json's _name_or_path, its last part). Read back as written, by the SAELens-format reader, and spliced
// by its own hook name at the module it was trained on. A hook TransformerLens has no name for keeps its own.
TEST(CliTrainSae, CfgJsonNamesTheHookAsTransformerLensAndTheModelByName) {
  flex_test::TempDir tmp;
  flex_examples::TinyGpt2Options mo;
  mo.n_layer = 2;
  mo.seed = 6;
  const std::string model = tmp.str("tiny-gpt2");
  flex_examples::write_tiny_gpt2(model, mo);
  at::manual_seed(10);
  flex::save_safetensors(tmp.str("ids.safetensors"),
                         {{"input_ids", at::randint(flex_examples::tiny_vocab_size(), {24, 32}, at::kLong)}});
  auto r = run({"capture", model, "--dataset", tmp.str("ids.safetensors"), "--context-len", "16", "--hook",
                "transformer.h.0", "--hook", "transformer.h.0.mlp.c_fc", "--stream-dir", tmp.str("acts")});
  ASSERT_EQ(r.code, 0) << r.err;
  auto train = [&](std::vector<std::string> source, const std::string& hook, const std::string& out) {
    std::vector<std::string> a = {"train-sae"};
    a.insert(a.end(), source.begin(), source.end());
    for (const std::string x : {"--hook", hook.c_str(), "--architecture", "topk", "--d-sae", "32", "--k", "4",
                                "--batch-tokens", "64", "--total-tokens", "256", "--eval-tokens", "64", "--out", out.c_str()})
      a.push_back(x);
    return run(a);
  };
  r = train({"--activations", tmp.str("acts")}, "transformer.h.0", tmp.str("sae"));
  ASSERT_EQ(r.code, 0) << r.err;
  auto meta = read_json(tmp.str("sae/cfg.json")).at("metadata");
  EXPECT_EQ(meta.at("hook_name"), "blocks.0.hook_resid_post");
  EXPECT_EQ(meta.at("model_name"), "tiny-gpt2");
  auto sae = flex::load_sae(tmp.str("sae"));
  EXPECT_EQ(sae->config().hook_name, "blocks.0.hook_resid_post");
  EXPECT_EQ(sae->config().model_name, "tiny-gpt2");
  flex::FlexModel fm(flex::load_pretrained(model));
  EXPECT_EQ(flex::splice_sae(fm, sae, {flex::SpliceMode::Observe}).module, "transformer.h.0.hook_resid_post");

  nlohmann::json cfg = read_json(model + "/config.json");
  cfg["_name_or_path"] = "some-org/tiny-named";
  std::ofstream(model + "/config.json") << cfg.dump();
  r = train({"--model", model, "--dataset", tmp.str("ids.safetensors"), "--context-len", "16", "--batch-size", "4",
             "--buffer-tokens", "256"},
            "transformer.h.1.hook_resid_pre", tmp.str("sae2"));
  ASSERT_EQ(r.code, 0) << r.err;
  meta = read_json(tmp.str("sae2/cfg.json")).at("metadata");
  EXPECT_EQ(meta.at("hook_name"), "blocks.1.hook_resid_pre");
  EXPECT_EQ(meta.at("model_name"), "tiny-named");

  r = train({"--activations", tmp.str("acts")}, "transformer.h.0.mlp.c_fc", tmp.str("sae3"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_json(tmp.str("sae3/cfg.json")).at("metadata").at("hook_name"), "transformer.h.0.mlp.c_fc");
  EXPECT_NE(r.err.find("no TransformerLens name"), std::string::npos) << r.err;
}

TEST(CliTrainSae, AFullDiskIsAnIOErrorAndARerunFinishesAsIfNothingHappened) {
  flex_test::TempDir tmp;
  // RLIMIT_FSIZE (ulimit -f, in 512-byte blocks under sh) below one trainer state file: the
  // first checkpoint cannot be written. SIGXFSZ ignored, so the write fails with EFBIG instead.
  auto args = topk_args(tmp.str("full"), 256 * 40);
  args.insert(args.end(), {"--checkpoint-every", std::to_string(256 * 10)});
  auto r = run(args, "trap '' XFSZ; ulimit -f 200;");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("flexmodel: error:"), std::string::npos) << r.err;
  EXPECT_TRUE(r.err.find("rror writing") != std::string::npos || r.err.find("cannot write") != std::string::npos ||
              r.err.find("disk full") != std::string::npos || r.err.find("No space") != std::string::npos ||
              r.err.find("too large") != std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(tmp.str("full/sae_weights.safetensors")));
  for (const auto& e : fs::recursive_directory_iterator(tmp.str("full")))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  // Without the limit the same command finishes, with the weights of a run that never failed.
  r = run(args);
  ASSERT_EQ(r.code, 0) << r.err;
  auto clean = topk_args(tmp.str("clean"), 256 * 40);
  clean.insert(clean.end(), {"--checkpoint-every", std::to_string(256 * 10)});
  ASSERT_EQ(run(clean).code, 0);
  const auto want = weights(tmp.str("clean")), got = weights(tmp.str("full"));
  for (const auto& [name, t] : want) EXPECT_TRUE(flex_test::equal(got.at(name), t)) << name;
}
