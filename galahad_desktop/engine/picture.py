"""A picture as the engine reads it: plain RGB pixels, and the PNG they are kept as (no
llama.cpp here: the document reader's child process builds these too)."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass


@dataclass(frozen=True)
class Picture:
    png: bytes
    width: int
    height: int
    rgb: bytes  # width × height × 3 bytes, row-major

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.png).hexdigest()

    @classmethod
    def from_png(cls, png: bytes) -> Picture:
        """A kept PNG's pixels (a PNG this app wrote, read back from the vault)."""
        from PIL import Image

        with Image.open(io.BytesIO(png), formats=["PNG"]) as image:
            rgb = image.convert("RGB")
            return cls(png, rgb.width, rgb.height, rgb.tobytes())
