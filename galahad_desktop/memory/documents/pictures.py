"""Pictures and scanned pages: checked and decoded in the limited child process, handed back
as plain RGB pixels with the PNG they are kept as.

Nothing from a dropped file reaches llama.cpp's own image decoder: the child (memory, CPU
and time limits, see system/child.py) opens it with Pillow, refuses what is not the picture
its name and bytes say, refuses declared sizes over MAX_PIXELS before decoding a pixel
(decompression bombs), takes a GIF's first frame, and scales the picture so its longer side
is at most MAX_SIDE (the model reads at most 1,120 image tokens, about 2.6 million pixels, so
nothing it could see is lost). The PNG it returns is what the vault keeps (encrypted) and
what a later re-read decodes: the same pixels every time.

A PDF whose pages carry no text layer (a scan) is rendered page by page with PDFium
(pypdfium2), each page a picture.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

from galahad_desktop.engine.picture import Picture
from galahad_desktop.errors import InputError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.documents.extraction import check_source_file, run_reader

PICTURE_SUFFIXES = frozenset([".png", ".jpg", ".jpeg", ".webp", ".gif"])
FORMATS = {"PNG": "a PNG", "JPEG": "a JPEG", "WEBP": "a WebP", "GIF": "a GIF"}
SUFFIX_FORMAT = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".gif": "GIF"}
MAX_PICTURE_BYTES = 48 * 1024 * 1024
MAX_PIXELS = 64_000_000  # declared width × height accepted before decoding
# Past 4 million pixels, a file must hold at least a byte per 20,000 declared pixels (far
# below what any real photo or scan compresses to).
DENSE_FROM, MIN_PIXELS_PER_BYTE = 4_000_000, 20_000
MAX_SIDE = 2048  # the kept picture's longer side
MAX_ASPECT = 24.0  # longer side over shorter: thinner strips hold too few patches
MAX_SCAN_PAGES = 64
SCAN_BUDGET_PIXELS = 48_000_000  # every page of one scanned document together
SCAN_SIDE = 1536  # a scanned page's longer side once rendered


def is_picture(path: Path) -> bool:
    return Path(path).suffix.lower() in PICTURE_SUFFIXES


def _normalized(image: object, name: str) -> bytes:
    """The picture as RGB, scaled to MAX_SIDE, written as PNG."""
    from PIL import Image

    assert isinstance(image, Image.Image)
    width, height = image.size
    if min(width, height) < 1 or max(width, height) / min(width, height) > MAX_ASPECT:
        raise InputError(
            f"'{name}' is {width}×{height} pixels; pictures thinner than 1:{MAX_ASPECT:.0f} "
            "are not read."
        )
    rgb = image.convert("RGB")
    longest = max(width, height)
    if longest > MAX_SIDE:
        scale = MAX_SIDE / longest
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        rgb = rgb.resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    rgb.save(out, "PNG", optimize=False, compress_level=6)
    return out.getvalue()


def check_picture_file(path: Path) -> bytes:
    """A dropped picture checked and normalized (child side): its PNG bytes."""
    return check_picture(path, path.name, path.stat().st_size)


def check_picture(source: Path | io.BytesIO, name: str, size: int) -> bytes:
    """A picture (a file, or bytes an API client sent) checked and normalized, child side:
    its PNG bytes. `name`'s suffix says what it must be."""
    from PIL import Image, UnidentifiedImageError

    expected = SUFFIX_FORMAT.get(Path(name).suffix.lower())
    # Opening reads only the header; the declared size is checked below, before any pixel
    # is decoded (with the dimensions in the message, which Pillow's own guard leaves out).
    Image.MAX_IMAGE_PIXELS = None
    try:
        with Image.open(source, formats=list(FORMATS)) as image:
            if expected is not None and image.format != expected:
                raise InputError(
                    f"'{name}' is {FORMATS.get(str(image.format), 'another kind of file')} "
                    f"picture, not {FORMATS[expected]} as its name says; refused."
                )
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise InputError(
                    f"'{name}' declares {width:,}×{height:,} pixels; at most "
                    f"{MAX_PIXELS / 1e6:.0f} million are read (a possible decompression "
                    "bomb). Nothing was stored."
                )
            if width * height > DENSE_FROM and size * MIN_PIXELS_PER_BYTE < width * height:
                # A tiny file declaring a huge picture is mostly fill the decoder invents.
                raise InputError(
                    f"'{name}' declares {width:,}×{height:,} pixels in only {size:,} bytes: "
                    "truncated or made to fill memory; refused. Nothing was stored."
                )
            image.seek(0)  # a GIF's (or animated WebP's) first frame
            image.load()
            return _normalized(image, name)
    except InputError:
        raise
    except UnidentifiedImageError:
        raise InputError(
            f"'{name}' is not a picture Galahad reads (PNG, JPEG, WebP or GIF)."
        ) from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise InputError(f"'{name}' is a damaged or truncated picture ({exc}).") from None


def picture_from_png(png: bytes, name: str) -> Picture:
    """A picture pasted in the window, as the PNG the window's own encoder wrote (never a
    file from outside: those go through the child): checked and scaled like a file."""
    from PIL import Image, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = None  # checked below, before decoding
    try:
        with Image.open(io.BytesIO(png), formats=["PNG"]) as image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise InputError(
                    f"'{name}' is {width:,}×{height:,} pixels; at most "
                    f"{MAX_PIXELS / 1e6:.0f} million are read. Nothing was stored."
                )
            image.load()
            return Picture.from_png(_normalized(image, name))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InputError(f"'{name}' could not be read as a picture ({exc}).") from None


def render_scanned_pdf(path: Path) -> list[bytes]:
    """Every page of a PDF without a text layer, rendered (child side): PNG bytes each."""
    import pypdfium2 as pdfium
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        document = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        raise InputError(f"'{path.name}' is not a readable PDF: {exc}") from None
    try:
        if len(document) > MAX_SCAN_PAGES:
            raise InputError(
                f"'{path.name}' is a scan of {len(document)} pages; at most {MAX_SCAN_PAGES} "
                "scanned pages are read as pictures."
            )
        pages = []
        # A pixel budget for the whole document as well as per page: a long scan is rendered
        # smaller, so neither the child nor this process holds more than the budget.
        per_page = SCAN_BUDGET_PIXELS / max(len(document), 1)
        for number in range(len(document)):
            page = document[number]
            width, height = page.get_size()  # in points
            scale = min(
                SCAN_SIDE / max(width, height, 1.0),
                (per_page / max(width * height, 1.0)) ** 0.5,
            )
            bitmap = page.render(scale=scale)
            pages.append(_normalized(bitmap.to_pil(), f"{path.name}, page {number + 1}"))
        return pages
    finally:
        document.close()


def worker_output(path: Path, mode: str) -> dict[str, object]:
    """What the child prints for a picture, a picture on stdin (`path` is its name) or a
    scanned PDF."""
    if mode == "picture-stdin":
        import sys

        data = sys.stdin.buffer.read(MAX_PICTURE_BYTES + 1)
        if len(data) > MAX_PICTURE_BYTES:
            raise InputError(f"'{path.name}' is over {MAX_PICTURE_BYTES // 2**20} MiB; refused.")
        pages = [check_picture(io.BytesIO(data), path.name, len(data))]
    elif mode == "scan":
        pages = render_scanned_pdf(path)
    else:
        pages = [check_picture_file(path)]
    return {"pictures": [base64.b64encode(page).decode("ascii") for page in pages]}


def read_pictures_bounded(
    path: Path,
    mode: str = "picture",
    timeout_s: float = 120.0,
    memory_mb: int = 2048,
    job: Job = NO_JOB,
) -> list[Picture]:
    """A picture file (mode "picture") or a scanned PDF's pages (mode "scan"), checked in
    a limited child process; each decoded here from the PNG the child wrote."""
    path = Path(path)
    check_source_file(path, MAX_PICTURE_BYTES, "pictures")
    result = run_reader(path, mode, timeout_s, memory_mb, job)
    return [Picture.from_png(base64.b64decode(page)) for page in result["pictures"]]


def read_picture_bytes_bounded(
    data: bytes, name: str, timeout_s: float = 60.0, memory_mb: int = 2048, job: Job = NO_JOB
) -> Picture:
    """A picture an API client sent (bytes, never written to a file), checked in the
    limited child like a dropped one; `name`'s suffix says what it must be."""
    if not data:
        raise InputError(f"'{name}' is empty.")
    if len(data) > MAX_PICTURE_BYTES:
        raise InputError(f"'{name}' is over {MAX_PICTURE_BYTES // 2**20} MiB; refused.")
    result = run_reader(Path(name), "picture-stdin", timeout_s, memory_mb, job, stdin=data)
    (page,) = result["pictures"]
    return Picture.from_png(base64.b64decode(page))
