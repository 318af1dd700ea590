"""Documents: extraction in a child process, parts, deposits into stored blocks."""
