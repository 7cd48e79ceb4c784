#pragma once
// Shared by the parallel2 mpirun programs: the mesh each run uses (FLEX_MESH
// "tp,pp,dp", set per CTest case; default: all ranks tensor parallel) and the
// golden input batch.
#include <flex/dispatch/safetensors.h>
#include <flex/parallel/communicator.h>
#include <flex/parallel/device_mesh.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>

#include "test_util.h"

namespace parallel2_test {

inline flex::MeshShape mesh_shape() {
  const char* env = std::getenv("FLEX_MESH");
  flex::MeshShape s;
  if (env && std::sscanf(env, "%d,%d,%d", &s.tp, &s.pp, &s.dp) == 3) return s;
  s.tp = flex::make_world_communicator()->size();
  return s;
}

/// The world mesh of this run, built once (collective on first use).
inline const flex::DeviceMesh& mesh() {
  static flex::DeviceMesh m = [] {
    auto s = mesh_shape();
    return flex::DeviceMesh(flex::make_world_communicator(), s.tp, s.pp, s.dp);
  }();
  return m;
}

/// input_ids of the fixtures' golden forward.
inline at::Tensor golden_input_ids() {
  return flex::SafetensorsFile::open(flex_test::fixture("golden/inputs.safetensors"))->get("input_ids").clone();
}

}  // namespace parallel2_test
