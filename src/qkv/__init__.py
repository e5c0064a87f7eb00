"""qkv: the Transformer of "Attention Is All You Need", from its equations to real use."""

__version__ = "0.1.0"
