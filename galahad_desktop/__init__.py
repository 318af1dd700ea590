"""Galahad Desktop: private local chat with encrypted, provable KV-cache grafts."""

__version__ = "0.1.0"
