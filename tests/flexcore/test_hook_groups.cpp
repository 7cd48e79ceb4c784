// Hook groups, table-driven: which hooks fire for a forward with given groups.
#include "tiny_lm.h"

#include <flex/flexcore/flex_model.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <regex>

#include "test_util.h"

using namespace flex;

namespace {

struct Fixture {
  std::shared_ptr<tiny::LM> lm = std::make_shared<tiny::LM>(32, 16, 3);
  FlexModel fm{lm};
  std::set<std::string> run(const std::vector<std::string>& groups, bool complement) {
    fm.clear();
    at::NoGradGuard ng;
    fm.forward(at::tensor({1, 2, 3}, at::kLong).view({1, 3}), groups, complement);
    std::set<std::string> out;
    for (const auto& kv : fm.output()) out.insert(kv.first);
    return out;
  }
};

using Names = std::set<std::string>;

}  // namespace

TEST(HookGroups, TableOfSelections) {
  Fixture f;
  auto mlps = f.fm.create_hook_group("mlps", std::regex("h\\.[0-9]+\\.mlp"));
  auto lns = f.fm.create_hook_group("norms", "ln_1");
  ASSERT_EQ(mlps.size(), 3u);
  ASSERT_EQ(lns.size(), 3u);
  f.fm.register_forward_hook(std::make_shared<HookFunction>("lm_head"));
  f.fm.update_hook_groups(std::vector<HookFunctionPtr>{mlps[1]}, "middle");
  f.fm.update_hook_groups("h.1.ln_1", "middle");

  const Names all = {"h.0.mlp", "h.1.mlp", "h.2.mlp", "h.0.ln_1", "h.1.ln_1", "h.2.ln_1", "lm_head"};
  struct Row {
    std::vector<std::string> groups;
    bool complement;
    Names expected;
  };
  std::vector<Row> table = {
      {{"all"}, false, all},
      {{"mlps"}, false, {"h.0.mlp", "h.1.mlp", "h.2.mlp"}},
      {{"mlps", "norms"}, false, {"h.0.mlp", "h.1.mlp", "h.2.mlp", "h.0.ln_1", "h.1.ln_1", "h.2.ln_1"}},
      {{"mlps"}, true, {"h.0.ln_1", "h.1.ln_1", "h.2.ln_1", "lm_head"}},
      {{"middle"}, false, {"h.1.mlp", "h.1.ln_1"}},
      {{"middle", "norms"}, false, {"h.1.mlp", "h.0.ln_1", "h.1.ln_1", "h.2.ln_1"}},
      {{"middle", "norms"}, true, {"h.0.mlp", "h.2.mlp", "lm_head"}},
      {{"all"}, true, {}},
      {{}, false, {}},
      {{"all"}, false, all},  // re-enabling after everything was disabled
  };
  for (size_t i = 0; i < table.size(); ++i)
    EXPECT_EQ(f.run(table[i].groups, table[i].complement), table[i].expected) << "row " << i;

  // One hook in several groups.
  EXPECT_EQ(f.fm.get_hook_function_groups(mlps[1]), (std::set<std::string>{"all", "mlps", "middle"}));
  EXPECT_EQ(f.fm.get_group_hook_functions("middle").size(), 2u);

  // Remove a tag: h.1.mlp leaves "middle" but stays in "mlps".
  f.fm.remove_hook_groups(std::vector<HookFunctionPtr>{mlps[1]}, "middle");
  EXPECT_EQ(f.run({"middle"}, false), (Names{"h.1.ln_1"}));
  EXPECT_EQ(f.run({"mlps"}, false), (Names{"h.0.mlp", "h.1.mlp", "h.2.mlp"}));
  f.fm.remove_hook_groups("ln_1", "norms");
  EXPECT_EQ(f.run({"norms"}, false), (Names{}));
  EXPECT_THROW(f.fm.remove_hook_groups("mlp", "all"), ConfigError);
  EXPECT_THROW(f.run({"nosuchgroup"}, false), NotFoundError);
}

TEST(HookGroups, GroupMembersShareSettingsAndEdit) {
  Fixture f;
  HookFunctionOptions o;
  o.save = false;
  o.editing_function = [](Module&, const at::Tensor& t, SaveContext&, TrainableModules&) { return t * 0; };
  f.fm.create_hook_group("zero_mlps", ".mlp", o);
  at::Tensor ids = at::tensor({1, 2, 3}, at::kLong).view({1, 3});
  at::NoGradGuard ng;
  at::Tensor edited = f.fm.forward(ids, {"zero_mlps"});
  // MLPs contribute nothing: the residual stream is the embedding.
  at::Tensor x = f.lm->wte->weight.index_select(0, ids.flatten()).view({1, 3, 16});
  auto mu = x.mean(-1, true);
  auto var = (x - mu).pow(2).mean(-1, true);
  at::Tensor ln = (x - mu) / at::sqrt(var + 1e-5) * f.lm->ln_f->weight + f.lm->ln_f->bias;
  EXPECT_TRUE(flex_test::close(edited, at::matmul(ln, f.lm->lm_head->weight.t()), 1e-5, 1e-5));
  at::Tensor plain = f.fm.forward(ids, {"zero_mlps"}, /*complement=*/true);
  EXPECT_TRUE(flex_test::equal(plain, (*f.lm)(ids)));
}

TEST(HookGroups, NothingMatchingIsAnError) {
  Fixture f;
  EXPECT_THROW(f.fm.create_hook_group("g", "attention"), NotFoundError);
  auto grads = f.fm.create_hook_group("wgrads", "mlp.0.weight", {}, HookType::Tensor);
  EXPECT_EQ(grads.size(), 3u);
}
