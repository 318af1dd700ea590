"""The core's memory: conversations, documents, retrieval, transfer and verified answers,
behind one facade (galahad.py)."""
