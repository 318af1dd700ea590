"""Which stored part answers a question: the router, its gate, the hybrid index."""
