// Runs under mpirun: the world communicator (MPI when launched by mpirun,
// else one local rank), the (tp, pp, dp) mesh over it and the parallel build
// of a loaded causal LM, so FlexModel(..., tensor_parallel_size=2) from
// Python runs on the same C++ pieces as the command line's --tp/--pp/--dp.
#include "bindings.h"

#include <flex/models/causal_lm.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/communicator.h>
#include <flex/parallel/device_mesh.h>

#include <ATen/ATen.h>

namespace flex::python {

void bind_parallel(py::module_& m) {
  m.def("world_size", [] { return make_world_communicator()->size(); },
        "Processes in this job (mpirun -np), 1 outside mpirun");
  m.def("world_rank", [] { return make_world_communicator()->rank(); });

  py::class_<DeviceMesh, std::shared_ptr<DeviceMesh>>(m, "DeviceMesh")
      .def(py::init([](int tp, int pp, int dp) {
             auto world = make_world_communicator();
             if (tp * pp * dp != world->size()) {
               const std::string product = std::to_string(tp * pp * dp);
               throw ConfigError("tensor_parallel_size " + std::to_string(tp) + " x pipeline_parallel_size " +
                                 std::to_string(pp) + " x data_parallel_size " + std::to_string(dp) + " = " + product +
                                 " processes, but this job has " + std::to_string(world->size()) +
                                 (world->size() == 1 ? " (run it under mpirun -np " + product + ")" : " (mpirun -np)"));
             }
             py::gil_scoped_release nogil;  // collective: every rank builds it
             return std::make_shared<DeviceMesh>(world, tp, pp, dp);
           }),
           py::arg("tp"), py::arg("pp"), py::arg("dp"))
      .def_property_readonly("rank", &DeviceMesh::rank)
      .def_property_readonly("tp_rank", &DeviceMesh::tp_rank)
      .def_property_readonly("pp_rank", &DeviceMesh::pp_rank)
      .def_property_readonly("dp_rank", &DeviceMesh::dp_rank)
      .def("describe", &DeviceMesh::describe)
      .def(
          "broadcast_",
          [](DeviceMesh& mesh, at::Tensor t, int root) {
            // In place on a tensor of the same shape everywhere (a trainable
            // module's parameter): rank `root`'s values on every rank.
            at::Tensor buffer = t.detach().contiguous();
            {
              py::gil_scoped_release nogil;
              mesh.comm()->broadcast(buffer, root);
            }
            if (!buffer.is_same(t)) {
              at::NoGradGuard no_grad;
              t.copy_(buffer);
            }
          },
          py::arg("tensor"), py::arg("root") = 0)
      .def("barrier", [](DeviceMesh& mesh) {
        py::gil_scoped_release nogil;
        mesh.comm()->barrier();
      });

  py::class_<ParallelCausalLM, Module, std::shared_ptr<ParallelCausalLM>>(m, "ParallelCausalLM")
      .def_property_readonly("stage_blocks", &ParallelCausalLM::stage_blocks);

  m.def(
      "parallelize",
      [](CausalLM& model, const DeviceMesh& mesh) {
        py::gil_scoped_release nogil;  // collective
        return parallelize(model, mesh);
      },
      py::arg("model"), py::arg("mesh"),
      "This rank's slices of `model` over `mesh` (every rank passes the same model)");
}

}  // namespace flex::python
