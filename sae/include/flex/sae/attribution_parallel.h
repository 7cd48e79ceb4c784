#pragma once
// Attribution graphs (flex/sae/attribution.h) on a tensor- or
// pipeline-parallel model, under mpirun (design decision 48):
//
//   flex::DeviceMesh mesh(flex::make_world_communicator(), /*tp=*/2, /*pp=*/1, /*dp=*/1);
//   auto lm = flex::load_parallel_pretrained(dir, mesh);
//   auto graph = flex::attribute(*lm, transcoders, input_ids);  // collective over the mesh
//
// Tensor parallel: every rank runs the same frozen forward and backward
// passes on its heads and MLP slices (the Megatron collectives give each
// rank the whole gradient at every MLP output and at the embeddings); rank 0
// alone contracts the gradients with the sources into edge rows.
// Pipeline parallel: each stage keeps its forward graph; the backward runs
// from the last stage to the first, each stage seeding its own targets plus
// the gradient the next stage sends for its output and sending back the one
// at its input; each stage contracts its layers' places (and the embeddings
// on stage 0) and the partial rows are summed on rank 0.
// Either way the transcoders are replicated and only rank 0 keeps rows (in
// memory, or with max_memory_bytes in its row file): its graph is the
// one-process graph. The other ranks return the same nodes (active
// features, selection, logits) with no adjacency (neither `adjacency` nor
// `streamed`). tp x pp meshes combine both (each tp slice runs its own
// stage-to-stage backward; tp rank 0 of each stage contracts). Data-parallel
// meshes: UnsupportedError naming the mesh.
#include <flex/models/parallel_lm.h>
#include <flex/sae/attribution.h>

namespace flex {

/// attribute() over `model`'s mesh (collective: every rank
/// calls it with the same transcoders, prompt and options).
AttributionGraph attribute(ParallelCausalLM& model, const Transcoders& transcoders, const at::Tensor& input_ids,
                           const AttributionOptions& options = {});

}  // namespace flex
