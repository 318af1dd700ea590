"""Voice memos: decoded and resampled in the limited child, bounded before and while decoding.

The decoder is FFmpeg's, through PyAV (its wheels bundle FFmpeg: WAV, MP3, M4A/AAC, OGG/Opus
and FLAC on every machine, with a resampler, and no system codec to install). llama.cpp's own
decoder never sees a dropped file. Each suffix names the one demuxer its bytes are read with
(never a probe), so a file cannot pull in a playlist or another file, and a file that is not
what its name says is refused. The child returns 16 kHz mono 16-bit PCM, what Gemma 4's
audio encoder hears; `memo_parts` cuts a long recording into parts at its quietest
moments.
"""

from __future__ import annotations

import base64
import io
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from galahad_desktop.engine.picture import SOUND_RATE, Sound
from galahad_desktop.errors import InputError
from galahad_desktop.jobs import NO_JOB, Job
from galahad_desktop.memory.documents.extraction import check_source_file, run_reader

SAMPLE_RATE = SOUND_RATE  # Gemma 4's audio encoder reads 16 kHz mono
MAX_AUDIO_BYTES = 256 * 2**20
MAX_AUDIO_SECONDS = 2 * 3600
SILENCE_DBFS = -60.0  # quieter than this throughout: nothing to hear

_PCM = frozenset({"pcm_s16le", "pcm_s24le", "pcm_s32le", "pcm_f32le", "pcm_u8"})
# suffix -> (FFmpeg demuxer, the codecs accepted in it, the name users know, with its article)
AUDIO_FORMATS: dict[str, tuple[str, frozenset[str], str]] = {
    ".wav": ("wav", _PCM, "a WAV"),
    ".mp3": ("mp3", frozenset({"mp3", "mp3float"}), "an MP3"),
    ".m4a": ("mov", frozenset({"aac", "alac"}), "an M4A"),
    ".aac": ("aac", frozenset({"aac"}), "an AAC"),
    ".ogg": ("ogg", frozenset({"opus", "vorbis", "flac"}), "an OGG"),
    ".opus": ("ogg", frozenset({"opus"}), "an Opus"),
    ".flac": ("flac", frozenset({"flac"}), "a FLAC"),
}
AUDIO_SUFFIXES = frozenset(AUDIO_FORMATS)


def is_audio(path: Path) -> bool:
    return Path(path).suffix.lower() in AUDIO_SUFFIXES


@dataclass(frozen=True)
class Memo:
    """A voice memo as the model hears it: 16 kHz mono PCM."""

    pcm: bytes  # 16-bit little-endian samples
    codec: str  # what the file held, as FFmpeg names it

    @property
    def samples(self) -> np.ndarray:
        return np.frombuffer(self.pcm, dtype="<i2")

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 2 / SAMPLE_RATE


def memo_parts(memo: Memo) -> list[Sound]:
    """A memo as the parts it is stored in: at most 30 s each, cut in pauses."""
    return Sound.from_pcm(memo.pcm).parts()


def _clock(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    if hours:
        return f"{hours} h {rest // 60:02d} min"
    return f"{rest // 60} min {rest % 60:02d} s" if rest >= 60 else f"{rest} s"


# A WAV's format tags (its "fmt " chunk) and the sample sizes each may hold.
WAV_SAMPLE_BITS = {1: (8, 16, 24, 32), 3: (32,)}  # PCM integers; IEEE floats
WAV_EXTENSIBLE = 0xFFFE  # the real tag is the first two bytes of its sub-format


def check_wav_header(head: bytes, file_size: int, name: str) -> None:
    """Refuse a WAV by what its header declares, before anything is decoded: a format
    other than PCM or float, a sample size its format cannot hold, or a length over
    MAX_AUDIO_SECONDS (the samples the file really holds, where the header claims more)."""
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise InputError(f"'{name}' is not a WAV file (it has no RIFF/WAVE header).")
    at, fmt, data_size = 12, None, None
    while at + 8 <= len(head) and (fmt is None or data_size is None):
        chunk, size = head[at : at + 4], struct.unpack_from("<I", head, at + 4)[0]
        if chunk == b"fmt " and size >= 16 and at + 8 + size <= len(head):
            fmt = struct.unpack_from("<HHIIHH", head, at + 8)
            if fmt[0] == WAV_EXTENSIBLE and size >= 26:
                fmt = (struct.unpack_from("<H", head, at + 32)[0], *fmt[1:])
        elif chunk == b"data":
            data_size = min(size, file_size - at - 8)
            break
        at += 8 + size + (size & 1)
    if fmt is None or data_size is None:
        raise InputError(f"'{name}' is damaged: its header says nothing of its samples.")
    tag, channels, rate, _rate_bytes, _block, bits = fmt
    if tag not in WAV_SAMPLE_BITS:
        raise InputError(f"'{name}' holds sound in WAV format {tag:#x}; PCM or float is read.")
    if bits not in WAV_SAMPLE_BITS[tag] or not channels or not rate:
        kind = "floating-point" if tag == 3 else "integer"
        raise InputError(
            f"'{name}' is damaged: its header says {channels} channel(s) of {bits}-bit "
            f"{kind} samples at {rate:,} Hz, which no WAV holds."
        )
    seconds = data_size / (channels * bits / 8 * rate)
    if seconds > MAX_AUDIO_SECONDS:
        raise InputError(
            f"'{name}' holds {_clock(seconds)} of sound; a memo may last at most "
            f"{_clock(MAX_AUDIO_SECONDS)}."
        )


def _wav_head(source: Path | io.BytesIO) -> tuple[bytes, int]:
    if isinstance(source, io.BytesIO):
        return bytes(source.getbuffer()[:65536]), len(source.getbuffer())
    with open(source, "rb") as file:
        return file.read(65536), os.fstat(file.fileno()).st_size


def decode_audio(source: Path | io.BytesIO, name: str) -> Memo:
    """Decode a memo (in the limited child): the demuxer its suffix names, one audio track
    in an accepted codec, no longer than MAX_AUDIO_SECONDS (declared or decoded), not all
    silence. Raises InputError naming the problem."""
    import av  # only the child decodes

    suffix = Path(name).suffix.lower()
    if suffix not in AUDIO_FORMATS:
        kinds = ", ".join(sorted(AUDIO_SUFFIXES))
        raise InputError(f"'{name}' is not a voice memo Galahad reads ({kinds}).")
    demuxer, codecs, label = AUDIO_FORMATS[suffix]
    if suffix == ".wav":
        check_wav_header(*_wav_head(source), name)
    try:
        container = av.open(source, format=demuxer, metadata_errors="ignore")
    except (av.error.FFmpegError, ValueError, OSError):
        raise InputError(f"'{name}' is not {label} file, or it is damaged.") from None
    try:
        return _decode(container, name, codecs, label)
    except av.error.FFmpegError as exc:
        raise InputError(f"'{name}' is damaged: decoding stopped ({exc.strerror}).") from None
    finally:
        container.close()


def _decode(container: object, name: str, codecs: frozenset[str], label: str) -> Memo:
    import av

    assert isinstance(container, av.container.InputContainer)
    if not container.streams.audio:
        raise InputError(f"'{name}' holds no sound track.")
    stream = container.streams.audio[0]
    if stream.codec_context is None:  # FFmpeg knows of no decoder for what it holds
        raise InputError(f"'{name}' holds sound in a form no decoder reads.")
    codec = stream.codec_context.name
    if codec not in codecs:
        raise InputError(f"'{name}' holds {codec} audio, which {label} memo may not hold.")
    declared = (container.duration or 0) / 1e6
    if declared > MAX_AUDIO_SECONDS:
        raise InputError(
            f"'{name}' says it lasts {_clock(declared)}; a memo may last at most "
            f"{_clock(MAX_AUDIO_SECONDS)}."
        )
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    limit = MAX_AUDIO_SECONDS * SAMPLE_RATE
    pieces: list[np.ndarray] = []
    count = frames = 0
    for frame in container.decode(stream):
        frames += 1
        for out in resampler.resample(frame):
            piece = out.to_ndarray().reshape(-1).astype("<i2")
            pieces.append(piece)
            count += len(piece)
        if count > limit:  # a declared length can lie
            raise InputError(
                f"'{name}' lasts longer than {_clock(MAX_AUDIO_SECONDS)}, the most a memo may."
            )
    for out in resampler.resample(None):
        pieces.append(out.to_ndarray().reshape(-1).astype("<i2"))
    if frames == 0:
        raise InputError(f"'{name}' is not {label} file (nothing in it decodes as one).")
    samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype="<i2")
    if len(samples) < SAMPLE_RATE // 10:
        raise InputError(f"'{name}' holds no sound (under a tenth of a second).")
    if declared and len(samples) / SAMPLE_RATE < declared - max(1.0, 0.05 * declared):
        raise InputError(
            f"'{name}' is cut short: it says it lasts {_clock(declared)} but holds "
            f"{_clock(len(samples) / SAMPLE_RATE)}."
        )
    if _loudness_dbfs(samples) < SILENCE_DBFS:
        raise InputError(f"'{name}' holds only silence.")
    return Memo(samples.tobytes(), codec)


def _loudness_dbfs(samples: np.ndarray) -> float:
    """The loudest 20 ms of the recording, in dB below full scale."""
    frame = SAMPLE_RATE // 50
    usable = len(samples) // frame * frame
    if usable == 0:
        return -120.0
    loudest = 0.0
    step = frame * 4096  # a minute and a half at a time: two hours never need gigabytes
    for at in range(0, usable, step):
        frames = samples[at : min(at + step, usable)].astype(np.float32).reshape(-1, frame)
        loudest = max(loudest, float(np.sqrt((np.square(frames / 32768.0)).mean(axis=1)).max()))
    return float(20 * np.log10(max(loudest, 1e-6)))


def worker_output(path: Path, mode: str) -> dict[str, object]:
    """What the child prints for a memo: its PCM (base64), length and codec."""
    if mode == "audio-stdin":
        import sys

        data = sys.stdin.buffer.read(MAX_AUDIO_BYTES + 1)
        if len(data) > MAX_AUDIO_BYTES:
            raise InputError(f"'{path.name}' is over {MAX_AUDIO_BYTES // 2**20} MiB; refused.")
        memo = decode_audio(io.BytesIO(data), path.name)
    else:
        memo = decode_audio(path, path.name)
    return {"audio": base64.b64encode(memo.pcm).decode("ascii"), "codec": memo.codec}


def read_audio_bounded(
    path: Path, timeout_s: float = 300.0, memory_mb: int = 2048, job: Job = NO_JOB
) -> Memo:
    """A voice memo decoded in a limited child process (refused with a message where it is
    not one, too big, too long, damaged or silent)."""
    path = Path(path)
    check_source_file(path, MAX_AUDIO_BYTES, "voice memos")
    result = run_reader(path, "audio", timeout_s, memory_mb, job)
    return Memo(base64.b64decode(str(result["audio"])), str(result["codec"]))
