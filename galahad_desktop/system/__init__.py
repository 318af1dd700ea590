"""Low-level, platform-aware helpers shared by every layer: atomic private files, the data
directory lock, and bounded child processes. Nothing here knows about models or vaults."""
