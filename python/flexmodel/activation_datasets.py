"""Activation datasets: run a corpus through a model and store chosen modules' per-token activations
in safetensors shards (what SAE, transcoder and probe training read), and read them back.

    result = flexmodel.capture_dataset(model, "corpus.jsonl", "acts", hooks=["transformer.h.6"],
                                       context_len=128, max_tokens=1_000_000, text_field="text")
    data = flexmodel.ActivationDataset("acts")
    for batch in data.loader(batch_tokens=4096, shuffle=True):
        x = batch["transformer.h.6"]          # [4096, 768]
"""
import json
import os

import torch

from . import _C
from ._arguments import dtype_name
from .errors import ConfigError
from .flex_model import FlexModel
from .modeling import PreTrainedModel, _engine_module


def capture_dataset(model, dataset, out_dir, hooks, context_len=128, batch_size=8, max_tokens=None, text_field=None,
                    store_dtype=torch.float32, positions="all", exclude_bos=False, seed=0, shard_size=256 << 20,
                    tokenizer=None, progress=None):
    """Captures ``hooks``' activations of every token of ``dataset`` into ``out_dir``.

    model: a FlexModel (its own hooks stay; under mpirun its mesh is used and rank 0 writes; a wrapped
        Transformers model too) or a model from from_pretrained.
    hooks: module names, or TransformerLens hook names (blocks.3.hook_resid_post), stored under that name.
    dataset: a text file (one document per line), JSON Lines (with text_field) or a safetensors file
        of token ids ("input_ids": [tokens] or [documents, tokens]).
    positions: "all", or K tokens drawn per context (seeded by seed and the context number).
    tokenizer: a folder with the tokenizer, or a GGUF file (default: the model's folder or GGUF file);
        token-id corpora need none.
    Resumable: run again on the same out_dir with the same settings, it continues after the last
    complete shard. Returns the counts of this run (contexts, tokens_run, tokens_stored, ...).
    """
    if isinstance(hooks, str):
        hooks = [hooks]
    if positions == "all":
        random_positions = 0
    elif isinstance(positions, int) and positions > 0:
        random_positions = positions
    else:
        raise ConfigError(f"positions must be 'all' or a positive number of tokens per context, got {positions!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"max_tokens must be at least 1, got {max_tokens}")
    max_contexts = -1 if max_tokens is None else (max_tokens + context_len - 1) // context_len
    if isinstance(model, FlexModel):
        # (A wrapped Transformers model: flexmodel's model around it knows its folder.)
        engine, distributed = model._engine, model._mesh is not None
        source = model.module if model._adopted is None else model._adopted
    else:
        engine, distributed, source = _C.FlexModel(_engine_module(model)), False, model
    model_dir = source.name_or_path if isinstance(source, PreTrainedModel) else None
    if tokenizer is None and model_dir is not None and (os.path.exists(os.path.join(model_dir, "tokenizer.json"))
                                                        or os.path.isfile(model_dir)):  # a GGUF: its vocabulary
        tokenizer = model_dir
    describe = {"model": os.path.abspath(model_dir)} if model_dir else {}
    return _C.capture_dataset(engine, None if tokenizer is None else os.fspath(tokenizer), os.fspath(dataset),
                              text_field, context_len, batch_size, max_contexts, list(hooks), os.fspath(out_dir),
                              dtype_name(store_dtype), random_positions, seed, exclude_bos, shard_size,
                              json.dumps(describe), progress, distributed)


class ActivationDataset:
    """A dataset written by :func:`capture_dataset` (or ``flexmodel capture --dataset``).

    ``len(data)`` is the number of stored tokens; ``data.shard(i)`` one shard's tensors (views of the
    mapped file); ``data.loader(...)`` batches of tokens; iterating the dataset is one pass in order.
    Each batch is a dict: every hook's ``[n, ...]`` activations and ``token_ids``, ``document``,
    ``position``, ``context``, ``offset`` (``[n]`` int64).
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._data = _C.ActivationDataset(self.path)

    @property
    def settings(self):
        """dataset.json: the capture's settings (model, hooks, context_len, shapes, dtype, ...)."""
        return json.loads(self._data.settings_json)

    @property
    def hooks(self):
        return list(self._data.hooks)

    @property
    def num_shards(self):
        return self._data.num_shards

    @property
    def num_contexts(self):
        return self._data.num_contexts

    def __len__(self):
        return self._data.num_tokens

    def shard(self, i):
        return self._data.shard(i)

    def loader(self, batch_tokens=4096, shuffle=False, shuffle_window=2, seed=0, hooks=None, keep_last=True):
        """An iterable of batches of ``batch_tokens`` tokens; each iteration is one pass. shuffle: the
        shards in a random order each pass, the tokens of ``shuffle_window`` shards mixed."""
        if batch_tokens < 1:
            raise ConfigError(f"batch_tokens must be at least 1, got {batch_tokens}")
        return ActivationLoader(self, dict(batch_tokens=batch_tokens, shuffle=shuffle, shuffle_window=shuffle_window,
                                           seed=seed, hooks=[] if hooks is None else list(hooks),
                                           keep_last=keep_last))

    def __iter__(self):
        return iter(self.loader())

    def __repr__(self):
        return f"<flexmodel.ActivationDataset {self.path!r}: {len(self)} tokens, hooks {self.hooks}>"


class ActivationLoader:
    """Batches over an ActivationDataset; iterate it once per epoch (a shuffled loader draws a new
    order each pass from its seed and the pass number)."""

    def __init__(self, dataset, options):
        self.dataset, self._options, self._passes = dataset, options, 0

    def __iter__(self):
        options = dict(self._options)
        options["seed"] = options["seed"] + self._passes
        self._passes += 1
        cpp = self.dataset._data.loader(**options)
        while True:
            batch = cpp.next()
            if batch is None:
                return
            yield batch
