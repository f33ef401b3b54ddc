"""translate: an English->French Transformer toolkit (prepare, train, decode, evaluate)."""

__version__ = "0.1.0"
