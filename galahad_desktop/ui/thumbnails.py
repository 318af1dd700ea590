"""Pictures shown small: decoded from the PNG the vault kept (decrypted in memory by the
core), scaled once, held in memory only, never written anywhere."""

from __future__ import annotations

import hashlib

from PySide6.QtCore import Qt
from PySide6.QtGui import QIcon, QImage, QPixmap

CARD_SIDE = 220  # a picture in the conversation, at most this many pixels on its longer side
LIST_SIDE = 40  # a picture document's icon in the Documents list


class Thumbnails:
    def __init__(self) -> None:
        self._images: dict[tuple[str, int], QImage] = {}

    @staticmethod
    def key(png: bytes) -> str:
        return hashlib.sha256(png).hexdigest()[:16]

    def image(self, png: bytes, side: int = CARD_SIDE) -> QImage:
        """The picture scaled to fit `side` (kept, so a redraw does not decode it again)."""
        found = self._images.get((self.key(png), side))
        if found is None:
            # Only Qt's PNG reader (our own PNG); PySide6 takes the format as text, whatever
            # its type stub says.
            decoded = QImage.fromData(png, "PNG")  # type: ignore[arg-type]
            found = decoded.scaled(
                side,
                side,
                Qt.AspectRatioMode.KeepAspectRatio,
                Qt.TransformationMode.SmoothTransformation,
            )
            self._images[(self.key(png), side)] = found
        return found

    def cached(self, key: str, side: int = CARD_SIDE) -> QImage | None:
        return self._images.get((key, side))

    def icon(self, png: bytes) -> QIcon:
        return QIcon(QPixmap.fromImage(self.image(png, LIST_SIDE)))

    def clear(self) -> None:
        """Forget every decoded picture (the window locks)."""
        self._images.clear()
