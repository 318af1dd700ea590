"""Conversations, documents and the service that grafts their blocks."""
