"""A conversation: the live context, turns, chains of blocks, continuing when full, search."""
