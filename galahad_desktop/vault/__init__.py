"""Encrypted storage: master key in the OS keyring, encrypted block files, encrypted catalog."""
