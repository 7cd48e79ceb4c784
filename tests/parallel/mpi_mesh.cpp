// Device meshes across real ranks: every (tp, pp, dp) of the issue, full or
// over a subset of the world, several at once; group membership checked by
// all-gathering world ranks inside each group against the Megatron layout.
#include <flex/parallel/device_mesh.h>

#include <gtest/gtest.h>

#include "mpi_util.h"
#include "test_util.h"

using namespace flex;
using flex_test::world;

namespace {

const std::vector<MeshShape> kShapes{{2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 1}, {2, 1, 2}, {1, 2, 2}};

// `ranks[i]` is the world rank of mesh rank i.
void check_mesh(const DeviceMesh& mesh, const std::vector<int>& ranks) {
  const MeshShape s = mesh.shape();
  const int wr = world()->rank();
  ASSERT_EQ(ranks[mesh.rank()], wr);
  EXPECT_EQ(mesh.coord(), mesh_coord_of(s, mesh.rank()));
  for (MeshAxis axis : {MeshAxis::TP, MeshAxis::PP, MeshAxis::DP}) {
    std::vector<int> expect;
    for (const auto& g : mesh_groups(s, axis)) {
      if (std::find(g.begin(), g.end(), mesh.rank()) != g.end()) {
        for (int x : g) expect.push_back(ranks[x]);
      }
    }
    auto got = mesh.group(axis)->all_gather(at::tensor({wr}, at::kInt));
    std::vector<int> ids;
    for (auto& t : got) ids.push_back(t.item<int>());
    EXPECT_EQ(ids, expect) << mesh.describe() << " axis " << static_cast<int>(axis);
  }
  EXPECT_EQ(mesh.tp_group()->rank(), mesh.tp_rank());
  EXPECT_EQ(mesh.pp_group()->rank(), mesh.pp_rank());
  EXPECT_EQ(mesh.dp_group()->rank(), mesh.dp_rank());
}

}  // namespace

TEST(Mesh, EveryShapeOfTheIssue) {
  auto w = world();
  const int n = w->size();
  for (const MeshShape& s : kShapes) {
    SCOPED_TRACE("tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp) + " dp=" + std::to_string(s.dp));
    if (s.size() == n) {
      DeviceMesh mesh(w, s.tp, s.pp, s.dp);
      std::vector<int> ranks(n);
      for (int i = 0; i < n; ++i) ranks[i] = i;
      check_mesh(mesh, ranks);
    } else if (s.size() < n) {
      // A mesh over the last ranks, listed in reverse: mesh rank i is world rank n-1-i.
      std::vector<int> ranks;
      for (int i = 0; i < s.size(); ++i) ranks.push_back(n - 1 - i);
      DeviceMesh mesh(w, ranks, s.tp, s.pp, s.dp, "subset");
      const bool in = std::find(ranks.begin(), ranks.end(), w->rank()) != ranks.end();
      EXPECT_EQ(mesh.member(), in);
      if (in) {
        check_mesh(mesh, ranks);
      } else {
        EXPECT_THROW(mesh.tp_group(), ConfigError);
      }
    } else {
      EXPECT_THROW(DeviceMesh(w, s.tp, s.pp, s.dp), ConfigError);
    }
  }
}

TEST(Mesh, SeveralMeshesAtOnce) {
  auto w = world();
  const int n = w->size();
  DeviceMesh a(w, n, 1, 1);  // all tensor parallel
  DeviceMesh b(w, 1, 1, n);  // all data parallel
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = at::ones({2}), y = at::ones({2});
    a.tp_group()->all_reduce(x);
    b.tp_group()->all_reduce(y);
    b.dp_group()->all_reduce(y);
    EXPECT_TRUE(flex_test::equal(x, at::full({2}, static_cast<double>(n))));
    EXPECT_TRUE(flex_test::equal(y, at::full({2}, static_cast<double>(n))));
  }
  EXPECT_EQ(a.tp_rank(), w->rank());
  EXPECT_EQ(b.dp_rank(), w->rank());
  EXPECT_EQ(b.tp_group()->size(), 1);
}
