"""Conversations in and out: the import readers and export writers."""
