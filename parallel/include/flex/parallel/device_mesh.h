#pragma once
// The (tp, pp, dp) device mesh in Megatron's order: mesh ranks are laid out
// as arange(n).reshape(pp, dp, tp), tensor-parallel fastest. For tp=pp=dp=2:
// tp groups [0,1] [2,3] [4,5] [6,7]; pp groups [0,4] [1,5] [2,6] [3,7];
// dp groups [0,2] [1,3] [4,6] [5,7].
// A mesh is a value object holding its sub-communicators, so several meshes
// (one per model) coexist in one program; a mesh may cover only some ranks
// of a communicator.
#include <flex/parallel/communicator.h>

#include <memory>
#include <string>
#include <vector>

namespace flex {

enum class MeshAxis { TP, PP, DP };

struct MeshShape {
  int tp = 1, pp = 1, dp = 1;
  int size() const { return tp * pp * dp; }
};

struct MeshCoord {
  int tp = 0, pp = 0, dp = 0;
  bool operator==(const MeshCoord& o) const { return tp == o.tp && pp == o.pp && dp == o.dp; }
};

/// Layout math (no communication).
int mesh_rank_of(const MeshShape& shape, const MeshCoord& c);
MeshCoord mesh_coord_of(const MeshShape& shape, int rank);
/// Every group along `axis`, each listing mesh ranks in axis order.
std::vector<std::vector<int>> mesh_groups(const MeshShape& shape, MeshAxis axis);

class DeviceMesh {
 public:
  /// Collective over `comm`: all its ranks form a tp x pp x dp mesh
  /// (ConfigError unless tp*pp*dp == comm->size()). A null `comm` gives a
  /// mesh this process is not part of.
  DeviceMesh(std::shared_ptr<Communicator> comm, int tp, int pp, int dp);
  /// Collective over `parent`: the listed parent ranks (mesh rank i is
  /// ranks[i]) form the mesh; other ranks get a mesh with member() == false.
  DeviceMesh(const std::shared_ptr<Communicator>& parent, const std::vector<int>& ranks, int tp, int pp, int dp,
             const std::string& name = "mesh");

  /// Whether this process belongs to the mesh. The accessors below throw
  /// ConfigError on non-members.
  bool member() const { return comm_ != nullptr; }
  const MeshShape& shape() const { return shape_; }
  int tp_size() const { return shape_.tp; }
  int pp_size() const { return shape_.pp; }
  int dp_size() const { return shape_.dp; }

  int rank() const;  // in the mesh
  MeshCoord coord() const;
  int tp_rank() const { return coord().tp; }
  int pp_rank() const { return coord().pp; }
  int dp_rank() const { return coord().dp; }

  const std::shared_ptr<Communicator>& comm() const;  // all mesh ranks
  const std::shared_ptr<Communicator>& tp_group() const;
  const std::shared_ptr<Communicator>& pp_group() const;
  const std::shared_ptr<Communicator>& dp_group() const;
  const std::shared_ptr<Communicator>& group(MeshAxis axis) const;

  /// "mesh(tp=2, pp=1, dp=2) rank 3 = (tp 1, pp 0, dp 1)" or "... (not a member)".
  std::string describe() const;

 private:
  void build();
  void require_member(const char* what) const;
  MeshShape shape_;
  std::shared_ptr<Communicator> comm_, tp_, pp_, dp_;
};

}  // namespace flex
