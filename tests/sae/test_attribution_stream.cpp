// The streamed attribution (AttributionOptions::max_memory_bytes, design
// decision 45) against the in-memory one on the fixture models with random
// transcoders: the adjacency read back from its file equals the dense
// adjacency (bitwise at the same batch size; within 1e-6 relative when the
// bound makes the batch smaller), the streamed pruning keeps the same nodes
// and edges with the same weights, the graph file is the same; the measured
// working memory stays under the bound; a bound below one batch of rows is
// a ConfigError naming the size needed; the temporary files are gone after
// the graph, and after an error (a write refused by RLIMIT_FSIZE).
#include <flex/hooks/errors.h>
#include <flex/models/auto_model.h>
#include <flex/sae/attribution.h>
#include <flex/sae/attribution_graph.h>
#include <flex/sae/attribution_stream.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <sys/resource.h>

#include "expect_error.h"
#include "random_transcoders.h"
#include "test_util.h"

using namespace flex;

namespace {

// Layer 0 a plain ReLU transcoder, later layers skip transcoders (as in
// test_attribution.cpp): pre-activations of a few units, a few dozen active features.
std::vector<std::shared_ptr<SparseDictionary>> stream_transcoders(const CausalLM& m, at::ScalarType dt) {
  flex_test::RandomTranscoders spec;
  spec.dtype = dt;
  spec.enc_scale = m.base_model_prefix() == "transformer" ? 0.25 : 2.0;
  spec.architecture = [](int64_t l) { return l == 0 ? SaeArchitecture::Transcoder : SaeArchitecture::SkipTranscoder; };
  return flex_test::random_transcoders(m, spec);
}

at::Tensor prompt() { return at::tensor({1, 17, 42, 7, 99, 5, 11, 3, 64}, at::kLong); }

// Largest |a - b| / max|b| (reported, and compared with the tolerance).
double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

bool folder_empty(const std::string& dir) { return std::filesystem::is_empty(dir); }

struct Case {
  std::string model;
  at::ScalarType dtype;
  int64_t max_feature_nodes;
};

void check_streamed_equals_dense(const Case& c) {
  SCOPED_TRACE(c.model + (c.dtype == at::kDouble ? " float64" : " float32") + " max_feature_nodes " +
               std::to_string(c.max_feature_nodes));
  auto m = load_pretrained(flex_test::fixture("models/" + c.model), c.dtype);
  auto tc = stream_transcoders(*m, c.dtype);
  AttributionOptions o;
  o.batch_size = 7;
  o.update_interval = 1;
  o.max_n_logits = 4;
  o.desired_logit_prob = 0.99;
  o.max_feature_nodes = c.max_feature_nodes;
  const AttributionGraph dense = attribute(*m, tc, prompt(), o);
  ASSERT_GT(dense.active_features.size(0), 20) << "too few active features to test anything";

  flex_test::TempDir tmp;
  o.temp_dir = tmp.str();
  o.max_memory_bytes = 1'000'000'000;  // room for the whole batch: the same batches as in memory
  const PrunedGraph dense_pruned = prune_graph(dense, 0.8, 0.98);
  GraphJsonInfo info;
  {
    const AttributionGraph g = attribute(*m, tc, prompt(), o);
    ASSERT_TRUE(g.streamed);
    EXPECT_FALSE(g.adjacency.defined());
    EXPECT_FALSE(folder_empty(tmp.str())) << "the rows are in a file under temp_dir while the graph lives";
    EXPECT_TRUE(flex_test::equal(g.active_features, dense.active_features));
    EXPECT_TRUE(flex_test::equal(g.selected_features, dense.selected_features));
    EXPECT_EQ(g.streamed->n_nodes(), dense.n_nodes());
    const at::Tensor adj = g.streamed->dense();
    std::cout << "[ info ] " << c.model << ": streamed vs dense adjacency, largest relative difference "
              << relative_difference(adj, dense.adjacency) << " over " << adj.numel() << " entries\n";
    EXPECT_TRUE(flex_test::equal(adj, dense.adjacency)) << "same batches, same arithmetic: bitwise";
    // Row blocks read in pieces (block_rows() is how the pruner reads): the same rows.
    const int64_t N = g.streamed->n_nodes();
    EXPECT_TRUE(flex_test::equal(at::cat({g.streamed->rows(0, 3), g.streamed->rows(3, N - 3)}), dense.adjacency));

    const PrunedGraph p = prune_graph(g, 0.8, 0.98);
    EXPECT_FALSE(p.edge_mask.defined());
    EXPECT_TRUE(flex_test::equal(p.node_mask, dense_pruned.node_mask));
    EXPECT_TRUE(flex_test::equal(p.edges, dense_pruned.edges)) << p.edges.size(0) << " vs " << dense_pruned.edges.size(0);
    EXPECT_TRUE(flex_test::equal(p.edge_weights, dense_pruned.edge_weights));
    EXPECT_LT(relative_difference(p.cumulative_scores, dense_pruned.cumulative_scores), 1e-6);
    EXPECT_GT(p.edges.size(0), 10) << "pruning kept almost nothing: nothing compared";
    EXPECT_LT(p.edges.size(0), (dense.adjacency != 0).sum().item<int64_t>()) << "pruning kept every edge";
    EXPECT_EQ(graph_json(g, p, info, 0.8).dump(), graph_json(dense, dense_pruned, info, 0.8).dump());
    EXPECT_GT(g.streamed->peak_working_bytes(), 0);
    EXPECT_LE(g.streamed->peak_working_bytes(), o.max_memory_bytes);
  }
  EXPECT_TRUE(folder_empty(tmp.str())) << "the graph's files outlive it";

  // Bounds down from the peak at batch 7 to the smallest one accepted (the
  // ranking still refreshes every 7 features):
  // fewer targets per pass (rows from other batches, rounding may differ),
  // the graph the same within 1e-6, the measured peak under each bound.
  o.max_memory_bytes = 1'000'000'000;
  const int64_t roomy = attribute(*m, tc, prompt(), o).streamed->peak_working_bytes();
  AttributionGraph tight;
  int64_t tried = 0;
  for (double f : {0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3}) {
    o.max_memory_bytes = static_cast<int64_t>(roomy * f);
    try {
      AttributionGraph g = attribute(*m, tc, prompt(), o);
      EXPECT_LE(g.streamed->peak_working_bytes(), o.max_memory_bytes);
      tight = std::move(g);
      ++tried;
    } catch (const ConfigError&) {
      break;
    }
  }
  ASSERT_TRUE(tight.streamed) << "no bound below the roomy peak was accepted";
  EXPECT_LT(tight.streamed->targets_per_pass(), 7) << "the smallest bound still ran whole batches";
  const double diff = relative_difference(tight.streamed->dense(), dense.adjacency);
  std::cout << "[ info ] " << c.model << ": " << tried << " bounds down to " << format_bytes(tight.streamed->max_memory_bytes())
            << " (peak at batch 7: " << format_bytes(roomy) << "): " << tight.streamed->targets_per_pass()
            << " targets per pass, measured peak " << format_bytes(tight.streamed->peak_working_bytes())
            << ", largest relative difference to the dense adjacency " << diff << "\n";
  EXPECT_TRUE(flex_test::equal(tight.selected_features, dense.selected_features));
  EXPECT_LT(diff, 1e-6);
  const PrunedGraph tp = prune_graph(tight, 0.8, 0.98);
  EXPECT_TRUE(flex_test::equal(tp.node_mask, dense_pruned.node_mask));
  EXPECT_TRUE(flex_test::equal(tp.edges, dense_pruned.edges));
  EXPECT_LE(tight.streamed->peak_working_bytes(), tight.streamed->max_memory_bytes()) << "pruning went over the bound";
}

TEST(AttributionStream, StreamedEqualsDenseGpt2) { check_streamed_equals_dense({"gpt2", at::kDouble, -1}); }

TEST(AttributionStream, StreamedEqualsDenseLlama) { check_streamed_equals_dense({"llama", at::kFloat, 12}); }

TEST(AttributionStream, BoundBelowOneBatchIsConfigErrorNamingTheSize) {
  auto m = load_pretrained(flex_test::fixture("models/gpt2"), at::kFloat);
  auto tc = stream_transcoders(*m, at::kFloat);
  flex_test::TempDir tmp;
  AttributionOptions o;
  o.temp_dir = tmp.str();
  o.max_memory_bytes = 4096;
  flex_test::expect_error<ConfigError>([&] { attribute(*m, tc, prompt(), o); },
                                       {"max_memory 4.10 kB", "needs: ", "per target row"});
  EXPECT_TRUE(folder_empty(tmp.str()));
  o.max_memory_bytes = -1;
  flex_test::expect_error<ConfigError>([&] { attribute(*m, tc, prompt(), o); }, {"max_memory_bytes", "-1"});
}

TEST(AttributionStream, TemporaryFilesGoWhenAWriteFails) {
  auto m = load_pretrained(flex_test::fixture("models/gpt2"), at::kFloat);
  auto tc = stream_transcoders(*m, at::kFloat);
  flex_test::TempDir tmp;
  AttributionOptions o;
  o.temp_dir = tmp.str();
  o.max_memory_bytes = 1'000'000'000;
  // Files of this process may not grow past 1 kB: the first batch of rows
  // cannot be written (EFBIG; SIGXFSZ ignored so that write() reports it).
  struct rlimit before {};
  getrlimit(RLIMIT_FSIZE, &before);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = before;
  small.rlim_cur = 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  flex_test::expect_error<IOError>([&] { attribute(*m, tc, prompt(), o); }, {"edges.bin", "cannot write"});
  setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(folder_empty(tmp.str())) << "a failed attribution left its temporary files";
  o.temp_dir = tmp.str("missing/folder");
  flex_test::expect_error<IOError>([&] { attribute(*m, tc, prompt(), o); }, {"missing/folder"});
}

}  // namespace
