"""Render assets/galahad.svg to the PNG sizes desktops want (assets/icons/galahad-N.png)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication, QImage, QPainter  # noqa: E402
from PySide6.QtSvg import QSvgRenderer  # noqa: E402

SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    app = QGuiApplication(sys.argv)
    renderer = QSvgRenderer(str(ROOT / "assets" / "galahad.svg"))
    out = ROOT / "assets" / "icons"
    out.mkdir(parents=True, exist_ok=True)
    for size in SIZES:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        renderer.render(painter)
        painter.end()
        image.save(str(out / f"galahad-{size}.png"))
    del app
    return 0


if __name__ == "__main__":
    sys.exit(main())
