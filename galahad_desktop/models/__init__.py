"""Models: the Gemma 4 catalog and the machine's fit (catalog.py), downloads from the
Hugging Face Hub (hub.py)."""
