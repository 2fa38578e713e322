"""The resume format on its own (one process, no World): any sharding written, any other sharding read
back bitwise; every fault — truncated, corrupted or missing shard, metadata of another model, a dtype or
shape mismatch, a save that never finished — one sentence naming the file and the tensor."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference.resume import ResumeError, Shard, finalize, latest, publish, read_box, read_metadata, write_rank

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64]


def boxes(shape, splits):
    """Every box of ``shape`` cut into splits[d] contiguous pieces along d (tensor_split: unequal, maybe empty)."""
    import itertools

    per_dim = []
    for n, k in zip(shape, splits, strict=True):
        cuts = [len(c) for c in torch.arange(n).tensor_split(k)]
        starts = [sum(cuts[:i]) for i in range(len(cuts))]
        per_dim.append([(s, c) for s, c in zip(starts, cuts, strict=True) if c > 0])
    for combo in itertools.product(*per_dim):
        yield tuple(s for s, _ in combo), tuple(c for _, c in combo)


def save(root, step, tensors: dict, splits: dict, replicas: int = 1):
    """Save ``tensors`` as if by ranks each holding one box (× ``replicas`` identical copies), then publish."""
    staging = root / f".staging-{step}"
    staging.mkdir(parents=True)
    per_rank = []
    for name, g in tensors.items():
        for off, ln in boxes(g.shape, splits[name]):
            box = g[tuple(slice(o, o + n) for o, n in zip(off, ln, strict=True))]
            per_rank += [[Shard(name, box, off, tuple(g.shape))] for _ in range(replicas)]
    for rank, shards in enumerate(per_rank):
        write_rank(staging, rank, shards)
    finalize(staging, len(per_rank), {"layout": "test"})
    return publish(root, step, staging)


def global_tensor(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-100, 100, shape, generator=gen).to(dtype)  # integer-valued: exact in every dtype


@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), data=st.data(),
       dtype=st.sampled_from(DTYPES), replicas=st.sampled_from([1, 2]))
def test_any_sharding_reads_back_as_any_other(tmp_path_factory, shape, data, dtype, replicas):
    root = tmp_path_factory.mktemp("ckpt")
    g = global_tensor(shape, dtype)
    saved = [data.draw(st.integers(1, 4)) for _ in shape]
    step = save(root, "step-1", {"w": g, "scalar": torch.tensor(7, dtype=torch.int64)},
                {"w": saved, "scalar": []}, replicas)
    assert latest(root) == step
    for off, ln in boxes(g.shape, [data.draw(st.integers(1, 4)) for _ in shape]):
        got = read_box(step, "w", off, ln, dtype=dtype, global_shape=shape)
        want = g[tuple(slice(o, o + n) for o, n in zip(off, ln, strict=True))]
        assert torch.equal(got, want), (saved, off, ln)
    assert read_box(step, "scalar", (), ()).item() == 7


def test_reads_only_the_bytes_it_needs(tmp_path, monkeypatch):
    """A 4 MiB tensor in 4 row shards: reading one row reads one block (64 KiB) per touched shard, not 4 MiB."""
    g = global_tensor((1024, 1024), torch.float32)
    step = save(tmp_path, "s", {"w": g}, {"w": [4, 1]})
    import builtins

    real_open, read = builtins.open, []

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def __getattr__(self, attr):
            return getattr(self.f, attr)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(builtins, "open", lambda p, m="r", *a, **k: Counting(real_open(p, m, *a, **k))
                        if str(p).endswith(".bin") else real_open(p, m, *a, **k))
    got = read_box(step, "w", (300, 0), (1, 1024))
    assert torch.equal(got, g[300:301])
    assert sum(read) <= 2 * 65536 + 4096, read  # the row (4 KiB) and the checksummed block(s) around it


@pytest.fixture()
def ckpt(tmp_path):
    g = global_tensor((400, 100), torch.float32)  # two halves of 80 KB: two checksum blocks each
    return save(tmp_path, "step-3", {"w": g, "b": global_tensor((100,), torch.float32, 1)}, {"w": [2, 1], "b": [1]}), g


def one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text and text.endswith(".")
    return text


def test_truncated_shard(ckpt):
    step, _ = ckpt
    path = step / "rank00001.bin"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ResumeError) as exc:
        read_box(step, "w", (200, 0), (200, 100))
    assert "'w'" in one_line(exc) and "rank00001.bin" in str(exc.value) and "truncated" in str(exc.value)


def test_corrupted_shard(ckpt):
    step, _ = ckpt
    path = step / "rank00000.bin"
    raw = bytearray(path.read_bytes())
    raw[70000] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert torch.equal(read_box(step, "w", (0, 0), (1, 100)), ckpt[1][:1])  # block 0 is intact
    with pytest.raises(ResumeError) as exc:
        read_box(step, "w", (0, 0), (200, 100))
    assert "corrupted" in one_line(exc) and "rank00000.bin" in str(exc.value) and "'w'" in str(exc.value)


def test_missing_shard_file_and_missing_shard(ckpt):
    step, _ = ckpt
    (step / "rank00001.bin").unlink()
    with pytest.raises(ResumeError) as exc:
        read_box(step, "w", (0, 0), (400, 100))
    assert "missing" in one_line(exc) and "rank00001.bin" in str(exc.value)
    meta = read_metadata(step)
    meta["tensors"]["w"]["shards"] = meta["tensors"]["w"]["shards"][:1]
    with pytest.raises(ResumeError) as exc:
        read_box(step, "w", (0, 0), (400, 100), metadata=meta)
    assert "cover 20000 of the 40000" in one_line(exc) and "a shard is missing" in str(exc.value)


def test_another_model_dtype_and_shape(ckpt):
    step, _ = ckpt
    other = "no tensor 'embed.weight': its 2 tensors (e.g. 'b') are another model's"
    for kwargs, needle in (({"name": "embed.weight"}, other),
                           ({"dtype": torch.bfloat16}, "stored as float32; bfloat16 was asked for"),
                           ({"global_shape": (400, 128)}, "global shape [400, 100]; the model has [400, 128]")):
        args = {"name": "w", "offsets": (0, 0), "lengths": (1, 1), **kwargs}
        with pytest.raises(ResumeError) as exc:
            read_box(step, **args)
        assert needle in one_line(exc)
    (step / "metadata.json").write_text(json.dumps({"format": "torch-dcp"}))
    with pytest.raises(ResumeError, match="is not a paritybench-resume checkpoint"):
        read_box(step, "w", (0, 0), (1, 1))


def test_an_unfinished_save_leaves_the_previous_step(tmp_path):
    g = global_tensor((10,), torch.float32)
    first = save(tmp_path, "step-1", {"w": g}, {"w": [2]})
    staging = tmp_path / ".staging-step-2"  # rank 1 died before writing: nothing is published
    staging.mkdir()
    write_rank(staging, 0, [Shard("w", g[:5] + 1, (0,), (10,))])
    with pytest.raises(ResumeError, match="rank 1 wrote no index"):
        finalize(staging, 2, {})
    assert latest(tmp_path) == first and torch.equal(read_box(latest(tmp_path), "w", (0,), (10,)), g)
    with pytest.raises(ResumeError, match="already exists"):
        publish(tmp_path, "step-1", staging)
    with pytest.raises(ResumeError, match="cover 5 of its 10 elements"):
        finalize(staging, 1, {})
    (tmp_path / "latest").write_text("step-9\n")
    with pytest.raises(ResumeError, match="points at 'step-9', which has no metadata.json"):
        latest(tmp_path)
    with pytest.raises(ResumeError, match="has no published checkpoint"):
        latest(tmp_path / "nowhere")
