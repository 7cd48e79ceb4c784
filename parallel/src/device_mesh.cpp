#include <flex/parallel/device_mesh.h>

namespace flex {

namespace {
void check_shape(const MeshShape& s) {
  if (s.tp < 1 || s.pp < 1 || s.dp < 1) {
    throw ConfigError("DeviceMesh(tp=" + std::to_string(s.tp) + ", pp=" + std::to_string(s.pp) +
                      ", dp=" + std::to_string(s.dp) + "): every size must be >= 1");
  }
}
std::string shape_str(const MeshShape& s) {
  return "tp=" + std::to_string(s.tp) + ", pp=" + std::to_string(s.pp) + ", dp=" + std::to_string(s.dp);
}
}  // namespace

int mesh_rank_of(const MeshShape& s, const MeshCoord& c) { return (c.pp * s.dp + c.dp) * s.tp + c.tp; }

MeshCoord mesh_coord_of(const MeshShape& s, int rank) {
  if (rank < 0 || rank >= s.size()) {
    throw ConfigError("rank " + std::to_string(rank) + " is outside a mesh(" + shape_str(s) + ")");
  }
  MeshCoord c;
  c.tp = rank % s.tp;
  c.dp = (rank / s.tp) % s.dp;
  c.pp = rank / (s.tp * s.dp);
  return c;
}

std::vector<std::vector<int>> mesh_groups(const MeshShape& s, MeshAxis axis) {
  check_shape(s);
  std::vector<std::vector<int>> out;
  // Outer loops run over the other two axes, slowest first (pp, dp, tp order).
  switch (axis) {
    case MeshAxis::TP:
      for (int p = 0; p < s.pp; ++p)
        for (int d = 0; d < s.dp; ++d) {
          out.emplace_back();
          for (int t = 0; t < s.tp; ++t) out.back().push_back(mesh_rank_of(s, {t, p, d}));
        }
      break;
    case MeshAxis::PP:
      for (int d = 0; d < s.dp; ++d)
        for (int t = 0; t < s.tp; ++t) {
          out.emplace_back();
          for (int p = 0; p < s.pp; ++p) out.back().push_back(mesh_rank_of(s, {t, p, d}));
        }
      break;
    case MeshAxis::DP:
      for (int p = 0; p < s.pp; ++p)
        for (int t = 0; t < s.tp; ++t) {
          out.emplace_back();
          for (int d = 0; d < s.dp; ++d) out.back().push_back(mesh_rank_of(s, {t, p, d}));
        }
      break;
  }
  return out;
}

DeviceMesh::DeviceMesh(std::shared_ptr<Communicator> comm, int tp, int pp, int dp)
    : shape_{tp, pp, dp}, comm_(std::move(comm)) {
  check_shape(shape_);
  if (comm_ && comm_->size() != shape_.size()) {
    throw ConfigError("DeviceMesh(" + shape_str(shape_) + ") needs " + std::to_string(shape_.size()) +
                      " ranks but communicator '" + comm_->name() + "' has " + std::to_string(comm_->size()));
  }
  build();
}

DeviceMesh::DeviceMesh(const std::shared_ptr<Communicator>& parent, const std::vector<int>& ranks, int tp, int pp,
                       int dp, const std::string& name)
    : shape_{tp, pp, dp} {
  check_shape(shape_);
  if (!parent) throw ConfigError("DeviceMesh over a rank subset needs a parent communicator");
  if (static_cast<int>(ranks.size()) != shape_.size()) {
    throw ConfigError("DeviceMesh(" + shape_str(shape_) + ") needs " + std::to_string(shape_.size()) +
                      " ranks but " + std::to_string(ranks.size()) + " were listed");
  }
  comm_ = parent->create_group(ranks, name);
  build();
}

void DeviceMesh::build() {
  if (!comm_) return;
  const MeshCoord c = mesh_coord_of(shape_, comm_->rank());
  // Colors number the groups along each axis; keys order ranks inside them.
  tp_ = comm_->split(c.pp * shape_.dp + c.dp, c.tp, "tp");
  pp_ = comm_->split(c.dp * shape_.tp + c.tp, c.pp, "pp");
  dp_ = comm_->split(c.pp * shape_.tp + c.tp, c.dp, "dp");
}

void DeviceMesh::require_member(const char* what) const {
  if (!comm_) throw ConfigError(std::string("DeviceMesh::") + what + ": this process is not part of " + describe());
}

int DeviceMesh::rank() const {
  require_member("rank");
  return comm_->rank();
}

MeshCoord DeviceMesh::coord() const {
  require_member("coord");
  return mesh_coord_of(shape_, comm_->rank());
}

const std::shared_ptr<Communicator>& DeviceMesh::comm() const {
  require_member("comm");
  return comm_;
}
const std::shared_ptr<Communicator>& DeviceMesh::tp_group() const {
  require_member("tp_group");
  return tp_;
}
const std::shared_ptr<Communicator>& DeviceMesh::pp_group() const {
  require_member("pp_group");
  return pp_;
}
const std::shared_ptr<Communicator>& DeviceMesh::dp_group() const {
  require_member("dp_group");
  return dp_;
}
const std::shared_ptr<Communicator>& DeviceMesh::group(MeshAxis axis) const {
  switch (axis) {
    case MeshAxis::TP: return tp_group();
    case MeshAxis::PP: return pp_group();
    case MeshAxis::DP: return dp_group();
  }
  return tp_group();
}

std::string DeviceMesh::describe() const {
  std::string s = "mesh(" + shape_str(shape_) + ")";
  if (!comm_) return s + " (not a member)";
  const MeshCoord c = mesh_coord_of(shape_, comm_->rank());
  return s + " rank " + std::to_string(comm_->rank()) + " = (tp " + std::to_string(c.tp) + ", pp " +
         std::to_string(c.pp) + ", dp " + std::to_string(c.dp) + ")";
}

}  // namespace flex
