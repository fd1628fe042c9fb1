"""Integrations with other libraries. Each lives in its own module and imports its library only when
that module is imported (``import flashattn`` imports none of them):

* :mod:`flashattn.integrations.transformers`: an attention implementation for HuggingFace transformers
  (``pip install flashattn[transformers]``).
"""
