"""Integrations with other libraries. Each lives in its own module and imports its library only when
that module is imported (``import flashattn`` imports none of them):

* :mod:`flashattn.integrations.transformers`: an attention implementation for HuggingFace transformers
  (``pip install flashattn[transformers]``).
* :mod:`flashattn.integrations.torch_flash_impl`: a provider of torch's flash-attention hook
  (``torch.nn.attention.activate_flash_attention_impl``, torch >= 2.11); opt-in with ``activate()``.
"""
