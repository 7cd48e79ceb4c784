"""Attribution graphs through per-layer or cross-layer transcoders (circuit-tracer's, computed in C++).

    graph = flexmodel.attribute(model, "path/to/transcoders", input_ids)
    graph["adjacency"]          # [N, N] direct effects, [target, source] (None with max_memory=)
    json.dump(graph["json"], open("graph.json", "w"))   # Neuronpedia's graph viewer opens it

    logits = flexmodel.intervene(model, "path/to/transcoders", input_ids, [(1, -1, 123, 0.0), "0:3:7*2"])

Nodes, in order: the active features that were computed (``selected_features`` into
``active_features`` [F, 3] = layer, position, feature), error nodes (layer * n_pos + pos),
token embeddings (n_pos), logits (``logit_tokens``). See sae/include/flex/sae/attribution.h.
"""

import os

from . import _C
from .modeling import _engine_module


def attribute(model, transcoders, input_ids, *, max_n_logits=10, desired_logit_prob=0.95, batch_size=256,
              max_feature_nodes=None, node_threshold=0.8, edge_threshold=0.98, zero_first_position=True,
              tokenizer=None, prompt="", slug="flexmodel-graph", scan=None, max_memory=None):
    """The attribution graph of one prompt (``input_ids`` [T] or [1, T]) through ``transcoders``:
    a folder of SAELens transcoder folders (one per layer, each reading its layer's MLP input and
    writing the MLP output), a list of ``flexmodel.sae.SparseDictionary``, one per layer, or a
    cross-layer transcoder in circuit-tracer's layout (a folder of W_enc_i / W_dec_i.safetensors,
    with an optional config.yaml naming its hooks, or one .safetensors file; design decision 44).

    Returns a dict: n_layers, n_pos, input_ids, active_features, activations, pre_activations,
    selected_features, logit_tokens, logit_probabilities, adjacency; the pruning at
    ``node_threshold`` / ``edge_threshold`` (node_mask, edge_mask, cumulative_scores); and
    "json", the graph file circuit-tracer writes for Neuronpedia (token strings from
    ``tokenizer.decode`` when given, else the ids). Errors are flexmodel.Error subclasses:
    ShapeError for a transcoder of the wrong width or a prompt longer than the context,
    ConfigError for a transcoder at the wrong hook or an option out of range.

    ``max_memory`` (bytes, or a size such as "2GB"): bound the working memory. The adjacency is
    then streamed by row blocks through a temporary file ($TMPDIR) and pruned from there; the
    dict's "adjacency" and "edge_mask" are None, the kept edges are in "edges" [E, 2] (target,
    source) and "edge_weights" [E] (given in every case), and "peak_working_memory" is the
    largest working memory measured. ConfigError naming the size needed when the bound is too
    small for one batch of rows.

    ``model`` may be a ``FlexModel`` built with ``tensor_parallel_size`` / ``pipeline_parallel_size``
    under mpirun: every rank calls attribute() with the same arguments; rank 0 gets the dict above
    (its graph equals the one-process graph), the other ranks the nodes only ("adjacency",
    "json" and the pruning entries None). A data-parallel mesh is an UnsupportedError."""
    if isinstance(transcoders, (str, os.PathLike)):
        transcoders_arg = os.fspath(transcoders)
        scan = scan or os.path.basename(os.path.normpath(transcoders_arg))
    else:
        transcoders_arg = list(transcoders)
    ids = input_ids.reshape(-1) if hasattr(input_ids, "reshape") else input_ids
    decode = None if tokenizer is None else (lambda i: tokenizer.decode([i]))
    # A FlexModel over a mesh (tensor/pipeline_parallel_size under mpirun): its sharded model;
    # every rank calls attribute(), rank 0 gets the graph (design decision 48).
    parallel = getattr(model, "_parallel_module", None)
    return _C.attribution.attribute(
        parallel if parallel is not None else _engine_module(model), transcoders_arg, ids, int(max_n_logits), float(desired_logit_prob), int(batch_size),
        -1 if max_feature_nodes is None else int(max_feature_nodes), bool(zero_first_position), float(node_threshold),
        float(edge_threshold), decode, prompt, slug, scan or "flexmodel", max_memory)


def intervene(model, transcoders, input_ids, interventions, *, frozen_attention=True):
    """The logits [T, V] of one prompt with transcoder features set or scaled, as circuit-tracer's
    ``ReplacementModel.feature_intervention``: the model's own forward runs, and at each edited
    layer the MLP output gains ``(target - a) * W_dec[feature]`` at the position, ``a`` being the
    feature's activation computed from that layer's MLP input in this pass. ``interventions``:
    (layer, position, feature, value) tuples that set the activation (a fifth element True
    scales it by value instead), or strings "LAYER:POS:FEATURE=VALUE" / "LAYER:POS:FEATURE*FACTOR";
    negative positions count from the end. ``frozen_attention`` (circuit-tracer's default) keeps
    every attention pattern at the clean run's; False recomputes them. ``transcoders`` as for
    attribute(). Errors: flexmodel.errors.ConfigError naming an intervention out of range."""
    transcoders_arg = os.fspath(transcoders) if isinstance(transcoders, (str, os.PathLike)) else list(transcoders)
    ids = input_ids.reshape(-1) if hasattr(input_ids, "reshape") else input_ids
    return _C.attribution.intervene(_engine_module(model), transcoders_arg, ids, list(interventions),
                                    bool(frozen_attention))


def intervene_generate(model, transcoders, input_ids, interventions, max_new_tokens, *, frozen_attention=True):
    """Greedy generation after one prompt with the interventions of intervene() at their prompt
    positions (circuit-tracer's ``feature_intervention_generate``, without open-ended positions):
    the prompt's positions keep their intervened values (with ``frozen_attention``, the clean run's
    patterns), new positions attend afresh. Returns (ids [T + max_new_tokens], logits
    [max_new_tokens, V] of each step's last position)."""
    transcoders_arg = os.fspath(transcoders) if isinstance(transcoders, (str, os.PathLike)) else list(transcoders)
    ids = input_ids.reshape(-1) if hasattr(input_ids, "reshape") else input_ids
    return _C.attribution.intervene_generate(_engine_module(model), transcoders_arg, ids, list(interventions),
                                             int(max_new_tokens), bool(frozen_attention))
