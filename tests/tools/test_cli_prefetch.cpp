// The CLI's --prefetch-depth N (design decision 41): `flexmodel capture` of
// the llama fixture with blocks on disk writes the same tensors, bit for bit,
// with prefetch 0 and 2 (its logits also within the fixture tolerance of the
// golden logits, made by Transformers); a negative depth is a usage error
// naming the option.
#include "../models/golden_util.h"
#include "cli_util.h"

#include <flex/dispatch/safetensors.h>

#include <fstream>

using cli_test::run;

TEST(CliPrefetch, DepthsWriteIdenticalCapturesAndBadDepthIsAUsageError) {
  flex_test::TempDir tmp;
  const std::string map = tmp.str("map.json");
  std::ofstream(map) << R"({"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "disk",
                           "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"})";
  const std::string model = models_test::model_dir("llama");
  const std::string ids = flex_test::fixture("golden/inputs.safetensors");
  std::vector<std::shared_ptr<flex::SafetensorsFile>> files;
  for (const char* depth : {"0", "2"}) {
    const std::string out = tmp.str(std::string("cap") + depth + ".safetensors");
    const auto r = run({"capture", model, "--input-ids", ids, "--hook", "model.layers.0.mlp", "--hook", "model.layers.1",
                        "--device-map", map, "--prefetch-depth", depth, "--out", out});
    ASSERT_EQ(r.code, 0) << r.err;
    files.push_back(flex::SafetensorsFile::open(out));
  }
  EXPECT_EQ(files[0]->names(), files[1]->names());
  for (const auto& n : files[0]->names())
    EXPECT_TRUE(flex_test::equal(files[1]->get(n), files[0]->get(n))) << n;
  EXPECT_TRUE(models_test::close(files[0]->get("logits"), models_test::golden_tensors("llama")->get("logits"),
                                 "CLI capture logits, prefetch 0"));
  const auto bad = run({"capture", model, "--input-ids", ids, "--hook", "model.layers.1", "--device-map", map,
                        "--prefetch-depth", "-1", "--out", tmp.str("bad.safetensors")});
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--prefetch-depth"), std::string::npos) << bad.err;
}
