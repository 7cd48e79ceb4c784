"""The torch engine under torch.distributed (gloo, CPU), 2 ranks: data-parallel and tensor-parallel
gathers give rank 0 the captures of one process, and edits of the whole activation reach every rank's
piece; compared with the same module run whole in this process with plain PyTorch hooks.

Run by CTest as ``mpirun -np 2 python -m pytest parallel_torch`` and, for the tp=2 x dp=2 mesh, with
``-np 4`` (tests/python/CMakeLists.txt); every rank runs every test, so the collectives line up.
"""
import copy
import os

import pytest
import torch
from torch import nn

import flexmodel
from conftest import assert_close
from tiny_modules import TinyViT

WORLD = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
pytestmark = pytest.mark.skipif(WORLD not in (2, 4), reason="runs under mpirun -np 2 or 4 (CTest "
                                "python_mpirun_torch_engine_np2 / _np4)")
two_ranks = pytest.mark.skipif(WORLD != 2, reason="a 2-rank test")


@pytest.fixture(scope="module", autouse=True)
def gloo():
    import torch.distributed as dist
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    job = os.environ.get("PMIX_NAMESPACE") or os.environ.get("OMPI_MCA_ess_base_jobid", "0")
    dist.init_process_group("gloo", init_method=f"file:///tmp/flexmodel-gloo-{job}", rank=rank, world_size=WORLD)
    yield dist
    dist.barrier()
    dist.destroy_process_group()


def test_world_is_the_job(gloo):
    # A launch that failed to start MPI would give N independent one-rank jobs: fail, don't skip.
    assert gloo.get_world_size() == WORLD


def same_on_every_rank(dist, t, what):
    pieces = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, t.contiguous())
    for r, p in enumerate(pieces):
        assert torch.equal(p, pieces[0]), f"{what} differs on rank {r}"


def plain(module, x, edits):
    """Every named module's first output tensor by plain forward hooks, with ``edits`` {name: fn(out)}."""
    got, handles = {}, []
    for name, m in module.named_modules():
        if not name:
            continue

        def hook(mod, a, out, name=name):
            t = out if isinstance(out, torch.Tensor) else out[0]
            got.setdefault(name, []).append(t.detach().clone())
            if name in edits:
                new = edits[name](t.clone())
                return new if isinstance(out, torch.Tensor) else (new,) + tuple(out[1:])
        handles.append(m.register_forward_hook(hook))
    with torch.no_grad():
        out = module(x)
    for h in handles:
        h.remove()
    return out, got


@two_ranks
def test_data_parallel_gather_equals_one_process(gloo):
    dist = gloo
    rank = dist.get_rank()
    torch.manual_seed(0)
    vit = TinyViT().eval()
    for p in vit.parameters():
        same_on_every_rank(dist, p.detach(), "a weight")
    images = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    steer = torch.linspace(-1, 1, 16)

    def edit(x):  # crosses ranks: row 1 is rank 0's, row 3 rank 1's
        x = x + steer
        x[3] = 0.0
        x[1, :, :4] *= 3.0
        return x
    want_logits, want = plain(copy.deepcopy(vit), images, {"blocks.0.mlp": edit})

    mine = images[:3] if rank == 0 else images[3:]      # uneven pieces: 3 and 2 rows
    out = {}
    fm = flexmodel.FlexModel(vit, out, data_parallel_size=2)
    assert fm.engine == "torch" and fm.rank == rank and fm.dp_rank == rank
    fm.create_hook_group("every", "")
    fm.register_forward_hook(flexmodel.HookFunction("blocks.0.mlp", expected_shape=(5, None, 16), save=False,
                                                    editing_function=lambda m, x, ctx, mods: edit(x.clone())))
    pre = flexmodel.HookFunction("blocks.1", expected_shape=(5, 5, 16))
    fm.register_forward_pre_hook(pre)
    with torch.no_grad():
        logits = fm(mine)
    assert_close(logits, want_logits[:3] if rank == 0 else want_logits[3:], 1e-5, f"rank {rank}'s logits")
    if rank != 0:
        assert out == {}, f"rank {rank} got captures {sorted(out)[:4]}"
        fm.restore()
        return
    assert sorted(k for k in out if "#" not in k) == sorted(want), sorted(set(out) ^ set(want))
    for key, tensors in want.items():
        assert_close(out[key], tensors[0], 1e-5, f"dp capture {key}")
    # blocks.1's input is blocks.0's (edited) output
    assert_close(out["blocks.1#input"], want["blocks.0"][0], 1e-5, "blocks.1#input")
    fm.restore()


class ParallelMLP(nn.Module):
    """fc1 column-parallel (its output split along the last dim over the ranks), fc2 row-parallel
    (partial products summed over the ranks): the whole MLP's output on every rank."""

    def __init__(self, whole, rank, world, group=None):
        super().__init__()
        self.group = group
        h = whole.fc1.out_features // world
        rows = slice(rank * h, (rank + 1) * h)
        self.fc1 = nn.Linear(whole.fc1.in_features, h)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(h, whole.fc2.out_features, bias=False)
        with torch.no_grad():
            self.fc1.weight.copy_(whole.fc1.weight[rows])
            self.fc1.bias.copy_(whole.fc1.bias[rows])
            self.fc2.weight.copy_(whole.fc2.weight[:, rows])
        self.bias = nn.Parameter(whole.fc2.bias.detach().clone())

    def forward(self, x):
        import torch.distributed as dist
        y = self.fc2(self.act(self.fc1(x)))
        dist.all_reduce(y, group=self.group)
        return y + self.bias


class MLP(nn.Module):
    def __init__(self, d=8, h=12):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(d, h), nn.GELU(), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@two_ranks
def test_tensor_parallel_gather_equals_one_process(gloo):
    dist = gloo
    rank = dist.get_rank()
    torch.manual_seed(0)
    whole = MLP().eval()
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(2))

    def edit(t):  # column 1 lives on rank 0, column 10 on rank 1
        t[..., 1] = 0.0
        t[..., 10] *= 3.0
        return t
    want_out, want = plain(whole, x, {"fc1": edit})
    part = ParallelMLP(whole, rank, 2).eval()
    out = {}
    fm = flexmodel.FlexModel(part, out, tensor_parallel_size=2)
    assert fm.tp_rank == rank
    fm.register_forward_hook(flexmodel.HookFunction("fc1", shard_dim=-1, save_after_edit=False,
                                                    editing_function=lambda m, t, ctx, mods: edit(t.clone())))
    # No shard_dim: the sharded dim is where the local shape differs from the expected whole one (Vector's rule).
    fm.register_forward_hook(flexmodel.HookFunction("act", expected_shape=(2, 3, 12)))
    fm.register_forward_hook(flexmodel.HookFunction("", expected_shape=(2, 3, 8)))  # replicated: no gather
    with torch.no_grad():
        y = fm(x)
    assert_close(y, want_out, 1e-5, f"rank {rank}'s output with the fc1 edit")
    if rank == 0:
        assert_close(out["fc1"], want["fc1"][0], 1e-5, "tp capture fc1 (before the edit)")
        assert_close(out["act"], want["act"][0], 1e-5, "tp capture act (inferred sharded dim)")
        assert_close(out[""], want_out, 1e-5, "replicated root output")
    else:
        assert out == {}
    fm.restore()


@two_ranks
def test_trainable_module_starts_from_rank_0(gloo):
    dist = gloo
    torch.manual_seed(dist.get_rank())           # a different probe on every rank ...
    probe = nn.Linear(4, 2)
    fm = flexmodel.FlexModel(MLP(), {}, data_parallel_size=2)
    fm.register_trainable_module("probe", probe)  # ... made rank 0's
    same_on_every_rank(dist, probe.weight.detach(), "probe weight")
    torch.manual_seed(0)
    assert_close(probe.weight, nn.Linear(4, 2).weight, 0, "rank 0's probe")
    with pytest.raises(flexmodel.UnsupportedError, match="gradient"):
        fm.register_full_backward_hook(flexmodel.HookFunction("fc1"))


@pytest.mark.skipif(WORLD != 4, reason="the tp=2 x dp=2 mesh runs on 4 ranks")
def test_tensor_and_data_parallel_mesh_equals_one_process(gloo):
    """Ranks 0,1 and 2,3 each hold the MLP split in two (tensor parallel) and run half the batch each
    (data parallel): gathered over both, rank 0's captures are one process's on the whole batch."""
    dist = gloo
    rank = dist.get_rank()
    tp_rank, dp_rank = rank % 2, rank // 2
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]   # the module's own all-reduce groups
    torch.manual_seed(0)
    whole = MLP().eval()
    x = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(2))

    def edit(t):  # rows of both data-parallel halves, columns of both tensor-parallel halves
        t[0, :, 2] = 0.0
        t[2, :, 9] *= -2.0
        return t
    want_out, want = plain(whole, x, {"fc1": edit})
    part = ParallelMLP(whole, tp_rank, 2, group=groups[dp_rank]).eval()
    mine = x[:2] if dp_rank == 0 else x[2:]                  # uneven: 2 rows and 1
    out = {}
    fm = flexmodel.FlexModel(part, out, tensor_parallel_size=2, data_parallel_size=2)
    assert (fm.tp_rank, fm.dp_rank) == (tp_rank, dp_rank)
    fm.register_forward_hook(flexmodel.HookFunction("fc1", expected_shape=(3, 4, 12),
                                                    editing_function=lambda m, t, ctx, mods: edit(t.clone())))
    fm.register_forward_hook(flexmodel.HookFunction("act", shard_dim=2))
    fm.register_forward_hook(flexmodel.HookFunction(""))
    with torch.no_grad():
        y = fm(mine)
    assert_close(y, want_out[:2] if dp_rank == 0 else want_out[2:], 1e-5, f"rank {rank}'s output")
    if rank == 0:
        for key in ("fc1", "act"):
            assert_close(out[key], want[key][0], 1e-5, f"tp x dp capture {key}")
        assert_close(out[""], want_out, 1e-5, "root output gathered over dp only")
    else:
        assert out == {}
    fm.restore()
