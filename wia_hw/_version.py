"""The version of wia-hw (one place; :mod:`wia_hw` and the extension registry read it)."""

__version__ = "0.1.0"
