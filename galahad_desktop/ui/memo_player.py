"""Playing a voice memo's card: its sound, decrypted by the core, piped from memory into the
desktop's own sound player (PulseAudio's or PipeWire's `paplay`, else ALSA's `aplay`),
never written to a file; one memo at a time.

Qt's own audio output lives in PySide6-Addons (175 MB more to install and bundle); every
Linux desktop already has one of these players, and each reads raw samples on its
standard input.
"""

from __future__ import annotations

import io
import shutil
import wave

from PySide6.QtCore import QObject, QProcess, Signal

# The player, and how it is told the samples are 16-bit mono at the memo's rate.
PLAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("paplay", ("--raw", "--format=s16le", "--channels=1", "--rate={rate}")),
    ("aplay", ("-q", "-t", "raw", "-f", "S16_LE", "-c", "1", "-r", "{rate}")),
)


def wav_seconds(wav: bytes) -> float:
    """How long a kept memo (16-bit mono WAV) lasts; 0 for bytes that are not one."""
    try:
        with wave.open(io.BytesIO(wav), "rb") as reader:
            return reader.getnframes() / max(1, reader.getframerate())
    except (wave.Error, EOFError):
        return 0.0


class MemoPlayer(QObject):
    """The transcript's one player: `playing` is the index of the card it plays, or None."""

    finished = Signal()
    failed = Signal(str)  # why the sound stopped before its end (said on the status line)

    def __init__(self) -> None:
        super().__init__()
        self.playing: int | None = None
        self._process: QProcess | None = None

    def play(self, index: int, wav: bytes) -> str:
        """Start a memo (stopping any other); returns why it cannot play, or ''."""
        self.stop()
        found = next(((name, args) for name, args in PLAYERS if shutil.which(name)), None)
        if found is None:
            return (
                "Sound cannot be played: no sound player was found (install pulseaudio-utils "
                "or alsa-utils)."
            )
        try:
            with wave.open(io.BytesIO(wav), "rb") as reader:
                if (reader.getnchannels(), reader.getsampwidth()) != (1, 2):
                    return "This memo's sound is not 16-bit mono."
                rate = reader.getframerate()
                pcm = reader.readframes(reader.getnframes())
        except (wave.Error, EOFError):
            return "This memo's sound could not be read."
        name, args = found
        process = QProcess(self)
        process.setProgram(str(shutil.which(name)))
        process.setArguments([a.format(rate=rate) for a in args])
        process.finished.connect(lambda code, _status: self._ended(process, code))
        process.errorOccurred.connect(lambda _error: self._ended(process, -1))
        self._process = process
        self.playing = index
        process.start()
        process.write(pcm)
        process.closeWriteChannel()
        return ""

    def _ended(self, process: QProcess, code: int) -> None:
        if process is not self._process:
            return  # stopped on purpose, or a later memo plays now
        said = bytes(process.readAllStandardError().data()).decode("utf-8", "replace").strip()
        self._process = None
        self.playing = None
        if code != 0:
            reason = said.splitlines()[-1] if said else process.errorString()
            self.failed.emit(f"The memo could not be played: {reason}")
        self.finished.emit()

    def stop(self) -> str:
        """Stop what plays (nothing to say: stopping cannot fail)."""
        process, self._process = self._process, None
        self.playing = None
        if process is not None:
            process.kill()
            process.waitForFinished(1000)
            self.finished.emit()  # whatever showed it playing shows Play again
        return ""
