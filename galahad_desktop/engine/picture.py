"""What the projector reads besides tokens (no llama.cpp here: the document reader's child
process builds these too): a picture as plain RGB pixels with the PNG it is kept as, and a
voice memo's sound as 16 kHz mono samples with the WAV it is kept as.

Both are kept (encrypted) as one blob next to what holds them; `media_from_kept` tells them
apart by the blob's own header, so every place that keeps or re-reads a picture keeps and
re-reads a sound the same way.
"""

from __future__ import annotations

import hashlib
import io
import wave
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from galahad_desktop.errors import InputError, IntegrityError

SOUND_RATE = 16_000  # what Gemma 4's audio encoder hears: 16 kHz mono
MAX_PART_SECONDS = 30.0  # the most llama.cpp's Gemma 4 audio encoder reads at once
WAV_MAGIC = b"RIFF"


@dataclass(frozen=True)
class Picture:
    png: bytes
    width: int
    height: int
    rgb: bytes  # width × height × 3 bytes, row-major

    @property
    def kept(self) -> bytes:
        """What the vault keeps of it."""
        return self.png

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


@dataclass(frozen=True)
class Sound:
    """A voice memo (or one part of a long one) as the model hears it."""

    wav: bytes  # 16 kHz mono 16-bit PCM in a WAV container: what the vault keeps

    @property
    def kept(self) -> bytes:
        return self.wav

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.wav).hexdigest()

    @property
    def pcm(self) -> bytes:
        """The 16-bit little-endian samples."""
        with wave.open(io.BytesIO(self.wav), "rb") as reader:
            return reader.readframes(reader.getnframes())

    @property
    def samples(self) -> np.ndarray:
        """The samples as float32 in [-1, 1), what llama.cpp's audio bitmap takes."""
        return np.frombuffer(self.pcm, dtype="<i2").astype(np.float32) / 32768.0

    @property
    def seconds(self) -> float:
        with wave.open(io.BytesIO(self.wav), "rb") as reader:
            return reader.getnframes() / SOUND_RATE

    def parts(self, max_seconds: float = MAX_PART_SECONDS) -> list[Sound]:
        """The sound cut into parts of at most max_seconds, each cut in a pause: what one
        read through the encoder takes (the same parts every time, so a ledger that holds
        them can be read again)."""
        pcm = self.pcm
        samples = np.frombuffer(pcm, dtype="<i2")
        ranges = cut_at_silences(samples, max_seconds)
        if len(ranges) == 1:
            return [self]
        return [Sound.from_pcm(pcm[2 * start : 2 * end]) for start, end in ranges]

    @classmethod
    def from_pcm(cls, pcm: bytes) -> Sound:
        """16 kHz mono 16-bit samples (what the decoding child returns) as a kept WAV."""
        out = io.BytesIO()
        with wave.open(out, "wb") as writer:
            writer.setnchannels(1)
            writer.setsampwidth(2)
            writer.setframerate(SOUND_RATE)
            writer.writeframes(pcm)
        return cls(out.getvalue())

    @classmethod
    def from_wav(cls, wav: bytes) -> Sound:
        """A kept WAV (one this app wrote, read back from the vault), checked to be one."""
        try:
            with wave.open(io.BytesIO(wav), "rb") as reader:
                shape = (reader.getnchannels(), reader.getsampwidth(), reader.getframerate())
                frames = reader.getnframes()
        except (wave.Error, EOFError) as exc:
            raise IntegrityError(f"A kept voice memo is not a WAV ({exc}).") from None
        if shape != (1, 2, SOUND_RATE) or frames == 0:
            raise IntegrityError("A kept voice memo is not 16 kHz mono 16-bit sound.")
        return cls(wav)


Media = Picture | Sound


def cut_at_silences(
    samples: np.ndarray, max_seconds: float = MAX_PART_SECONDS, search_seconds: float = 5.0
) -> list[tuple[int, int]]:
    """[start, end) sample ranges of at most max_seconds each, every cut at the quietest
    20 ms in the last search_seconds before the limit (a pause between words, where there
    is one), so no part ends inside a word where the recording allows it."""
    frame = SOUND_RATE // 50
    longest = int(max_seconds * SOUND_RATE)
    search = min(int(search_seconds * SOUND_RATE), longest // 2)
    parts: list[tuple[int, int]] = []
    start = 0
    while len(samples) - start > longest:
        window = samples[start + longest - search : start + longest].astype(np.float64)
        usable = len(window) // frame * frame
        energy = (window[:usable].reshape(-1, frame) ** 2).mean(axis=1)
        cut = start + longest - search + _middle_of_quietest(energy) * frame
        parts.append((start, cut))
        start = cut
    parts.append((start, len(samples)))
    return parts


def _middle_of_quietest(energy: np.ndarray) -> int:
    """The middle frame of the latest run of the quietest frames (a pause's middle)."""
    quiet = energy <= energy.min() * 1.01 + 1e-9
    end = len(quiet) - int(np.argmax(quiet[::-1]))  # one past the latest quiet frame
    begin = end - 1
    while begin > 0 and quiet[begin - 1]:
        begin -= 1
    return (begin + end) // 2


def media_from_kept(blob: bytes) -> Media:
    """A kept picture or sound, by its blob's header."""
    if blob.startswith(WAV_MAGIC):
        return Sound.from_wav(blob)
    return Picture.from_png(blob)


# The ledger's placeholders for embedding positions (kept here, free of llama.cpp, so that
# what only reads ledgers never loads it).
def cannot_hear() -> InputError:
    return InputError(
        "This model cannot hear voice memos: it has no projector with an audio encoder (Gemma "
        "4 E2B and E4B hear, with their projector). Nothing was stored.",
        command="galahad models get --size E4B --vision",
        window="Choose E2B or E4B with its projector file under File → Settings… (Model).",
    )


SEES_NOTHING = "This projector reads no pictures (it has no vision encoder)."


def placeholder(index: int) -> int:
    """The ledger's token at every embedding position of its `index`-th picture or sound."""
    return -1 - index


def picture_index(token: int) -> int | None:
    return -1 - token if token < 0 else None


def holds_pictures(tokens: Sequence[int]) -> bool:
    return any(t < 0 for t in tokens)


def pictures_in(tokens: Sequence[int]) -> list[int]:
    """The picture indices a ledger (or a stretch of one) holds, in order."""
    seen: list[int] = []
    for token in tokens:
        if token < 0 and (not seen or seen[-1] != -1 - token):
            seen.append(-1 - token)
    return seen


@dataclass
class LedgerRead:
    elapsed_ms: float = 0.0
    pictures: int = 0
    image_tokens: int = 0  # a picture's embedding positions evaluated
    encode_ms: float = 0.0  # in the projector's encoders
    sounds: int = 0  # voice memo parts
    audio_tokens: int = 0  # a sound's embedding positions evaluated
