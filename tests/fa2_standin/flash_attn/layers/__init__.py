"""``flash_attn.layers``."""
