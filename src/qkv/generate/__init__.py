"""Deprecated: the inference APIs moved to :mod:`qkv.inference` (``qkv.generate.lm`` is
``qkv.inference.lm``, and so on). The old module names work for one more release and warn
(``DeprecationWarning``) when a name is taken from them."""
