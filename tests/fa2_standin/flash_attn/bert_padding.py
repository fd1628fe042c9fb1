"""``flash_attn.bert_padding``: moving rows between a padded batch and the packed (total, ...) layout."""
import torch


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...) and a bool attention_mask (batch, seqlen), True on real tokens, to
    (rows (total, ...), indices (total,) into the flattened batch, cu_seqlens (batch + 1,) int32,
    max_seqlen (int), seqused (batch,) int32). With unused_mask (tokens that are kept in the packed rows
    but not attended, FlashAttention-2's meaning), rows cover mask | unused_mask and seqused counts the
    attention_mask's tokens alone."""
    keep = attention_mask if unused_mask is None else attention_mask | unused_mask
    seqused = attention_mask.sum(dim=-1, dtype=torch.int32)
    lengths = keep.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(keep.flatten(), as_tuple=False).flatten()
    max_seqlen = int(lengths.max().item()) if lengths.numel() else 0
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    rows = hidden_states.reshape(-1, *hidden_states.shape[2:])[indices]
    return rows, indices, cu_seqlens, max_seqlen, seqused


def pad_input(hidden_states, indices, batch, seqlen):
    """Packed rows (total, ...) back to (batch, seqlen, ...), zeros where no row was packed."""
    out = hidden_states.new_zeros(batch * seqlen, *hidden_states.shape[1:])
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
