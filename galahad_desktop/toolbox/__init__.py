"""Tools the window's chats may call: MCP servers (a program on this computer, or a URL),
reached with the official `mcp` SDK; only this package imports it."""
