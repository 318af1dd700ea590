"""PySide6 desktop app: the only package that imports Qt."""
