"""The `flash_attn` stand-in (tests/fa2_standin) that runs FlashAttention-2's own test file against
flashattn: its padding helpers, its rotary embedding, and the plugin that picks a part of that file's grid.
(The suite itself needs a GPU: scripts/fa2_suite.py.)"""
import os
import subprocess
import sys

import pytest
import torch

from test_kvcache import _rotary_reference

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fa2_standin")


@pytest.fixture
def standin():
    """The stand-in's modules, imported from its folder and dropped again afterwards, so that no other test
    sees a `flash_attn` package."""
    sys.path.insert(0, STANDIN)
    try:
        import flash_attn.bert_padding
        import flash_attn.flash_attn_interface
        import flash_attn.layers.rotary
        yield flash_attn
    finally:
        sys.path.remove(STANDIN)
        for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
            del sys.modules[name]


def test_standin_routes_to_flashattn(standin):
    import flashattn
    for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache",
                 "flash_attn_varlen_qkvpacked_func"):
        assert getattr(standin, name) is getattr(flashattn, name)
        assert getattr(standin.flash_attn_interface, name) is getattr(flashattn, name)
    with pytest.raises(NotImplementedError, match="S_dmask"):
        standin.flash_attn_interface._get_block_size_n("cuda", 64, True, False)


def test_unpad_pad_round_trip(standin):
    torch.manual_seed(0)
    x = torch.randn(3, 7, 2, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1] * 7, [0, 1, 1, 0, 1, 0, 0]], dtype=torch.bool)
    rows, indices, cu_seqlens, max_seqlen, seqused = standin.bert_padding.unpad_input(x, mask)
    assert rows.shape == (3 + 7 + 3, 2, 4)
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 3, 10, 13]
    assert max_seqlen == 7 and seqused.tolist() == [3, 7, 3]
    torch.testing.assert_close(rows, x[mask], rtol=0, atol=0)
    back = standin.bert_padding.pad_input(rows, indices, 3, 7)
    torch.testing.assert_close(back, x * mask[..., None, None], rtol=0, atol=0)
    # unused tokens are packed but not counted as used
    unused = torch.zeros_like(mask)
    unused[0, 3] = True
    rows, _, cu_seqlens, _, seqused = standin.bert_padding.unpad_input(x, mask, unused)
    assert rows.shape[0] == 14 and cu_seqlens.tolist() == [0, 4, 11, 14] and seqused.tolist() == [3, 7, 3]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offsets", ["int", "tensor"])
def test_apply_rotary_emb(standin, interleaved, offsets):
    torch.manual_seed(1)
    batch, seqlen, heads, head_dim, rotary_dim, seqlen_ro = 2, 5, 3, 16, 8, 20
    angle = torch.rand(seqlen_ro, rotary_dim // 2) * 6.283
    cos, sin = angle.cos(), angle.sin()
    x = torch.randn(batch, seqlen, heads, head_dim)
    seqlen_offsets = 4 if offsets == "int" else torch.tensor([0, 9], dtype=torch.int32)
    start = torch.as_tensor(seqlen_offsets).reshape(-1, 1).expand(batch, 1)
    positions = start.long() + torch.arange(seqlen)
    expected = _rotary_reference(x, cos, sin, positions, interleaved).float()
    apply = standin.layers.rotary.apply_rotary_emb
    torch.testing.assert_close(apply(x, cos, sin, interleaved=interleaved, seqlen_offsets=seqlen_offsets),
                               expected, rtol=1e-5, atol=1e-5)
    # packed rows: the same two sequences as (total, heads, dim) with cu_seqlens
    cu_seqlens = torch.tensor([0, seqlen, 2 * seqlen], dtype=torch.int32)
    packed = apply(x.reshape(-1, heads, head_dim), cos, sin, interleaved=interleaved,
                   seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens, max_seqlen=seqlen)
    torch.testing.assert_close(packed, expected.reshape(-1, heads, head_dim), rtol=1e-5, atol=1e-5)
    inplace = x.clone()
    assert apply(inplace, cos, sin, interleaved=interleaved, inplace=True, seqlen_offsets=seqlen_offsets) is inplace
    torch.testing.assert_close(inplace, expected, rtol=1e-5, atol=1e-5)


GRID = '''
import pytest

@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("paged", [None, 256])
def test_flash_attn_kvcache(alibi, d, paged):
    pass

@pytest.mark.parametrize("d", [32, 64])
def test_flash_attn_kvcache_paged_block_table_bounds(d):
    pass

def test_flash_attn_splitkv():
    pass
'''


def _collected(tmp_path, *options):
    test_file = tmp_path / "test_grid.py"
    test_file.write_text(GRID)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([STANDIN, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-m", "pytest", str(test_file), "-p", "fa2_select", "-p",
                             "no:cacheprovider", "--collect-only", "-q", "--rootdir", str(tmp_path), *options],
                            capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_select_plugin(tmp_path):
    assert len(_collected(tmp_path)) == 12 + 2 + 1
    kvcache = _collected(tmp_path, "--fa2-function", "test_flash_attn_kvcache", "--fa2-where", "alibi=False")
    assert len(kvcache) == 6 and all("test_flash_attn_kvcache[" in i and "False" in i for i in kvcache)
    paged = _collected(tmp_path, "--fa2-function", "test_flash_attn_kvcache", "--fa2-where", "paged=None",
                       "--fa2-where", "d=64")
    assert len(paged) == 2
    sample = _collected(tmp_path, "--fa2-sample", "2", "--fa2-seed", "3")
    assert len(sample) == 2 + 2 + 1  # two of each function, all of one that has fewer
    assert sample == _collected(tmp_path, "--fa2-sample", "2", "--fa2-seed", "3")  # reproducible


def test_fa2_suite_command():
    sys.path.insert(0, os.path.join(os.path.dirname(STANDIN), "..", "scripts"))
    try:
        import fa2_suite
    finally:
        sys.path.pop(0)
    command = fa2_suite.pytest_command("x/test_flash_attn.py", ["kvcache", "splitkv"], 50, 1, ["alibi=False"],
                                       "out/junit.xml", ["-x"])
    text = " ".join(command)
    for part in ("-p fa2_select", "--fa2-function test_flash_attn_kvcache", "--fa2-function test_flash_attn_splitkv",
                 "--fa2-sample 50", "--fa2-seed 1", "--fa2-where alibi=False", "--junitxml out/junit.xml"):
        assert part in text
    assert command[-1] == "-x"
