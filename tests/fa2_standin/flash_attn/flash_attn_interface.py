"""``flash_attn.flash_attn_interface``: the API functions, and the two helpers FlashAttention-2's tests read."""
from flash_attn import *  # noqa: F401,F403 (the API functions, re-exported)

USE_TRITON_ROCM = False


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """FlashAttention-2's key-block width, which its tests use to unpack its dropout matrix. flashattn's
    ``return_attn_probs`` keep-mask is a different function (flashattn's Philox mask, returned as a plain
    (batch, heads, seqlen_q, seqlen_k) tensor), so there is no such width to give."""
    raise NotImplementedError("flash_attn stand-in: flashattn's dropout keep-mask is not FlashAttention-2's "
                              "blocked S_dmask layout; tests that unpack it do not apply")
