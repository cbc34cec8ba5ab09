"""Compression passes: one module per pass (its config, contract and code), the registry in ``registry.py``,
the working model and pass context in ``base.py``."""
