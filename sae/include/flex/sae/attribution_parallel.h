#pragma once
// Attribution graphs (flex/sae/attribution.h) on a tensor-parallel model,
// under mpirun (design decision 48):
//
//   flex::DeviceMesh mesh(flex::make_world_communicator(), /*tp=*/2, /*pp=*/1, /*dp=*/1);
//   auto lm = flex::load_parallel_pretrained(dir, mesh);
//   auto graph = flex::attribute(*lm, transcoders, input_ids);  // collective over the mesh
//
// Every rank runs the same frozen forward and backward passes on its heads
// and MLP slices (the Megatron collectives give each rank the whole
// gradient at every MLP output and at the embeddings); the transcoders are
// replicated. Rank 0 alone contracts the gradients with the sources and
// keeps the edge rows (in memory, or with max_memory_bytes in its row
// file): its graph is the one-process graph. The other ranks return the
// same nodes (active features, selection, logits) with no adjacency
// (neither `adjacency` nor `streamed`).
// Pipeline or data parallel meshes: UnsupportedError naming the mesh.
#include <flex/models/parallel_lm.h>
#include <flex/sae/attribution.h>

namespace flex {

/// attribute() over `model`'s tensor-parallel mesh (collective: every rank
/// calls it with the same transcoders, prompt and options).
AttributionGraph attribute(ParallelCausalLM& model, const Transcoders& transcoders, const at::Tensor& input_ids,
                           const AttributionOptions& options = {});

}  // namespace flex
