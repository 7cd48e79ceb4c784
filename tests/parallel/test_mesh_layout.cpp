// Device mesh layout math (Megatron order), single process.
#include <flex/parallel/device_mesh.h>
#include <flex/parallel/local_communicator.h>

#include <gtest/gtest.h>

using namespace flex;
using Groups = std::vector<std::vector<int>>;

TEST(MeshLayout, MegatronOrder222) {
  const MeshShape s{2, 2, 2};
  EXPECT_EQ(mesh_groups(s, MeshAxis::TP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh_groups(s, MeshAxis::PP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh_groups(s, MeshAxis::DP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

TEST(MeshLayout, SmallShapes) {
  EXPECT_EQ(mesh_groups({2, 1, 1}, MeshAxis::TP), (Groups{{0, 1}}));
  EXPECT_EQ(mesh_groups({2, 1, 1}, MeshAxis::DP), (Groups{{0}, {1}}));
  EXPECT_EQ(mesh_groups({1, 2, 1}, MeshAxis::PP), (Groups{{0, 1}}));
  EXPECT_EQ(mesh_groups({1, 1, 2}, MeshAxis::DP), (Groups{{0, 1}}));
  EXPECT_EQ(mesh_groups({2, 2, 1}, MeshAxis::PP), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh_groups({2, 1, 2}, MeshAxis::DP), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh_groups({1, 2, 2}, MeshAxis::PP), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh_groups({1, 2, 2}, MeshAxis::DP), (Groups{{0, 1}, {2, 3}}));
}

// Independent of mesh_groups: rank = arange(n).reshape(pp, dp, tp)[p][d][t].
TEST(MeshLayout, CoordMatchesReshape) {
  for (MeshShape s : {MeshShape{2, 3, 4}, MeshShape{3, 1, 2}, MeshShape{1, 4, 1}}) {
    int r = 0;
    for (int p = 0; p < s.pp; ++p)
      for (int d = 0; d < s.dp; ++d)
        for (int t = 0; t < s.tp; ++t, ++r) {
          const MeshCoord c = mesh_coord_of(s, r);
          EXPECT_EQ(c.tp, t);
          EXPECT_EQ(c.pp, p);
          EXPECT_EQ(c.dp, d);
          EXPECT_EQ(mesh_rank_of(s, c), r);
        }
    // Every rank is in exactly one group per axis.
    for (MeshAxis a : {MeshAxis::TP, MeshAxis::PP, MeshAxis::DP}) {
      std::vector<int> seen(s.size(), 0);
      for (const auto& g : mesh_groups(s, a))
        for (int x : g) seen[x]++;
      for (int n : seen) EXPECT_EQ(n, 1);
    }
  }
  EXPECT_THROW(mesh_coord_of({2, 1, 1}, 2), ConfigError);
}

TEST(DeviceMesh, SingleProcess) {
  auto world = std::make_shared<LocalCommunicator>();
  DeviceMesh mesh(world, 1, 1, 1);
  EXPECT_TRUE(mesh.member());
  EXPECT_EQ(mesh.rank(), 0);
  EXPECT_EQ(mesh.tp_group()->size(), 1);
  EXPECT_EQ(mesh.pp_group()->name(), "pp");
  EXPECT_EQ(mesh.dp_group()->size(), 1);
}

TEST(DeviceMesh, WrongSizeIsConfigError) {
  auto world = std::make_shared<LocalCommunicator>();
  try {
    DeviceMesh mesh(world, 2, 1, 1);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs 2 ranks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DeviceMesh(world, 0, 1, 1), ConfigError);
}

TEST(DeviceMesh, NonMemberSaysSo) {
  DeviceMesh outside(nullptr, 2, 1, 1);
  EXPECT_FALSE(outside.member());
  EXPECT_NE(outside.describe().find("not a member"), std::string::npos);
  EXPECT_THROW(outside.tp_group(), ConfigError);
  // A subset mesh that leaves this (only) rank out.
  auto world = std::make_shared<LocalCommunicator>();
  EXPECT_THROW(DeviceMesh(world, std::vector<int>{1}, 1, 1, 1), ConfigError);  // rank 1 does not exist
}
