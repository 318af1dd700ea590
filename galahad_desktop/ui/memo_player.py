"""Playing a voice memo's card: its sound, decrypted by the core, played from memory (a
buffer handed to Qt's audio output, never a file), one memo at a time."""

from __future__ import annotations

import io
import wave
from typing import Any

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QObject, Signal


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

    def __init__(self) -> None:
        super().__init__()
        self.playing: int | None = None
        self._sink: Any = None
        self._buffer: QBuffer | None = None

    def play(self, index: int, wav: bytes) -> str:
        """Start a memo (stopping any other); returns why it cannot play, or ''."""
        self.stop()
        try:
            from PySide6.QtMultimedia import QAudio, QAudioFormat, QAudioSink, QMediaDevices
        except ImportError as exc:
            return f"Sound cannot be played here: Qt's audio output is missing ({exc})."
        device = QMediaDevices.defaultAudioOutput()
        if device.isNull():
            return "Sound cannot be played: this computer has no sound output."
        try:
            with wave.open(io.BytesIO(wav), "rb") as reader:
                rate, channels = reader.getframerate(), reader.getnchannels()
                pcm = reader.readframes(reader.getnframes())
        except (wave.Error, EOFError):
            return "This memo's sound could not be read."
        fmt = QAudioFormat()
        fmt.setSampleRate(rate)
        fmt.setChannelCount(channels)
        fmt.setSampleFormat(QAudioFormat.SampleFormat.Int16)
        if not device.isFormatSupported(fmt):
            return "The sound output cannot play 16-bit mono sound at this rate."
        self._buffer = QBuffer()
        self._buffer.setData(QByteArray(pcm))
        self._buffer.open(QIODevice.OpenModeFlag.ReadOnly)
        self._sink = QAudioSink(device, fmt)
        self._sink.stateChanged.connect(
            lambda state: self._state(state, QAudio.State.IdleState, QAudio.State.StoppedState)
        )
        self._sink.start(self._buffer)
        self.playing = index
        return ""

    def _state(self, state: Any, idle: Any, stopped: Any) -> None:
        if state in (idle, stopped) and self.playing is not None:
            self.stop()
            self.finished.emit()

    def stop(self) -> str:
        """Stop what plays (nothing to say: stopping cannot fail)."""
        sink, buffer = self._sink, self._buffer
        self._sink = self._buffer = None
        self.playing = None
        if sink is not None:
            sink.stop()
        if buffer is not None:
            buffer.close()
        return ""
