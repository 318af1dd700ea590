"""Voice memos heard once (#37): decoded in the limited child, heard through Gemma 4's audio
encoder at their own positions, stored as encrypted blocks and grafted back with 0 recomputed
tokens and an exact proof, in documents (cut in pauses into 30-second parts) and inside
chained conversations; a model that cannot hear refuses them, nothing stored.

The model tier runs the Gemma 4 test model with a test projector that also hears
(galahad_dev/gemma4_projector.py with `audio`: the real gemma4a layout, random weights), the
way E2B's and E4B's projectors do; the memos are spoken by espeak-ng."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from galahad_desktop.engine.picture import SOUND_RATE, Sound, cut_at_silences, media_from_kept
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.vision import pictures_in
from galahad_desktop.errors import InputError
from galahad_desktop.memory.galahad import Galahad
from tests.helpers import (
    ask_grafts_exactly,
    cli_json,
    convert_audio,
    media_cores,
    on_the_real_keyring,
    resumes_from_its_blocks,
)

Params = SamplingParams(max_tokens=6, temperature=0.0, seed=1)
TOKENS_PER_SECOND = 25  # Gemma 4's audio encoder: 100 mel frames a second, two stride-2 convs


def spoken(folder: Path, text: str, name: str = "memo.wav") -> Path:
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is missing: scripts/setup.sh installs it")
    path = folder / name
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    return path


def long_memo(folder: Path, seconds: float) -> Path:
    """A memo of about `seconds`: spoken sentences with half-second pauses, as 16 kHz WAV."""
    import av

    sentence = spoken(folder, "The orchard needs water on Friday before the frost comes.", "s.wav")
    with av.open(str(sentence)) as source:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SOUND_RATE)
        pieces = [
            out.to_ndarray().reshape(-1)
            for frame in source.decode(audio=0)
            for out in resampler.resample(frame)
        ]
    speech = np.concatenate(pieces).astype("<i2")
    pause = np.zeros(SOUND_RATE // 2, dtype="<i2")
    total: list[np.ndarray] = []
    while sum(len(p) for p in total) < seconds * SOUND_RATE:
        total += [speech, pause]
    path = folder / f"long-{int(seconds)}.wav"
    path.write_bytes(Sound.from_pcm(np.concatenate(total).tobytes()).wav)
    return path


# -- fast tier: the kept sound and its parts ------------------------------------------------
def test_a_sound_is_kept_as_a_wav_and_read_back_by_its_header() -> None:
    pcm = (np.sin(np.arange(SOUND_RATE * 2) / 7) * 8000).astype("<i2").tobytes()
    sound = Sound.from_pcm(pcm)
    assert sound.wav.startswith(b"RIFF") and abs(sound.seconds - 2.0) < 1e-6
    back = media_from_kept(sound.kept)
    assert isinstance(back, Sound) and back.pcm == pcm and back.sha256 == sound.sha256
    assert back.samples.dtype == np.float32 and float(np.abs(back.samples).max()) < 1.0
    with wave.open(io.BytesIO(sound.wav)) as reader:
        assert (reader.getnchannels(), reader.getframerate()) == (1, SOUND_RATE)


def test_a_long_sound_is_cut_in_the_same_pauses_every_time() -> None:
    rng = np.random.default_rng(5)
    words = (rng.standard_normal(SOUND_RATE * 4) * 6000).astype("<i2")
    pause = np.zeros(SOUND_RATE // 3, dtype="<i2")
    pcm = np.concatenate([words, pause] * 20).tobytes()  # ~87 s
    sound = Sound.from_pcm(pcm)
    parts = sound.parts()
    # Each cut in the last pause before 30 s (every 4.33 s): parts of ~26 s, then the rest.
    assert len(parts) == 4 and all(25.0 < p.seconds <= 30.0 for p in parts[:3])
    assert b"".join(p.pcm for p in parts) == pcm  # nothing lost or repeated at the cuts
    assert [p.sha256 for p in Sound.from_wav(sound.wav).parts()] == [p.sha256 for p in parts]
    samples = np.frombuffer(pcm, dtype="<i2")
    for start, _end in cut_at_silences(samples)[1:]:  # every cut falls in a pause
        assert not samples[start - 80 : start + 80].any()


# -- model tier: the Gemma 4 test model with a projector that hears ------------------------
@pytest.fixture()
def open_core(tmp_path: Path, hearing_model: Path) -> Iterator[Callable[..., Galahad]]:
    with media_cores(tmp_path / "data", hearing_model) as factory:
        yield factory


@on_the_real_keyring
def test_a_memo_deposited_and_asked_from_new_processes(tmp_path: Path, hearing_model: Path) -> None:
    data = tmp_path / "data"
    info = cli_json("info", data_dir=data, model=hearing_model)
    assert info["vision"]["audio"] and info["vision"]["audio_sample_rate"] == SOUND_RATE
    memo = spoken(tmp_path, "Remind me to water the pear trees in the orchard on Friday.")
    m4a = tmp_path / "orchard.m4a"
    convert_audio(memo, m4a, "aac")
    deposited = cli_json("deposit", str(m4a), data_dir=data, model=hearing_model)
    assert deposited["sounds"] == 1 and deposited["pictures"] == 0
    seconds = deposited["audio_seconds"]
    assert 2.0 < seconds < 8.0
    assert abs(deposited["audio_tokens"] - seconds * TOKENS_PER_SECOND) <= 2
    assert deposited["tokens"] > deposited["audio_tokens"]  # header, markers and reply
    ask_grafts_exactly(deposited, "What should I do on Friday?", data, hearing_model, "memo")


@pytest.mark.model
def test_a_long_memo_is_stored_in_parts_each_grafted_exactly(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    core = open_core()
    path = long_memo(tmp_path, 70)
    deposited = core.deposit(path)
    assert deposited.n_parts == 3 and deposited.sounds == 3
    assert abs(deposited.audio_tokens - deposited.audio_seconds * TOKENS_PER_SECOND) <= 6
    parts = core.parts(deposited.document_id)
    kept = [core.document_picture(deposited.document_id, p.part_no) for p in parts]
    assert all(k is not None and k.startswith(b"RIFF") for k in kept)
    heard = [media_from_kept(k) for k in kept if k is not None]
    assert sum(s.seconds for s in heard if isinstance(s, Sound)) == pytest.approx(
        deposited.audio_seconds, abs=0.01
    )
    [summary] = core.list_documents()
    assert summary.kind == "memo" and summary.n_parts == 3
    whole = core.document_memo(deposited.document_id)  # the memo to play: its parts joined
    assert whole is not None and Sound.from_wav(whole).pcm == Sound.from_wav(path.read_bytes()).pcm
    # A part of over 768 positions wraps the test model's sliding-window ring; its state is
    # stored in position order all the same, so it can be cut and spliced (a layout).
    owners = {deposited.document_id}
    assert max(p.n_tokens for p in parts) > 768
    assert all(core.live.read_state(p.block_id, owners).meta["layout"] for p in parts)
    core.close()

    core = open_core()  # a new engine: each part comes back from its block
    decoded = core.engine.decoded_tokens
    answered = core.ask("When is the frost?", deposited.document_id, parts[1].id, params=Params)
    assert answered.answered and answered.graft is not None
    assert answered.graft.proof.verdict == "exact" and answered.graft.recomputed_tokens == 0
    assert core.engine.decoded_tokens - decoded < parts[1].n_tokens  # not heard again


@pytest.mark.model
def test_a_memo_in_a_chained_conversation_resumes_exactly(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    core = open_core()
    conversation = core.new_conversation()
    core.send(conversation, "Here is what I recorded this morning.", params=Params)
    added = core.add_document_file(conversation, long_memo(tmp_path, 40))
    assert added.audio_tokens >= 30 * TOKENS_PER_SECOND and added.counters.recomputed_tokens == 0
    last = core.send(conversation, "What did I say about the orchard?", params=Params)
    core.close()

    core = open_core()  # a new engine: everything comes back from the memo's two parts
    resumes_from_its_blocks(core, conversation, "And the frost?", last, added.audio_tokens, Params)
    messages = core.messages(conversation)
    sounds = [m.sound for m in messages if m.sound]
    assert len(sounds) == 1 and sounds[0].startswith(b"RIFF")
    assert not any(m.picture for m in messages)


@pytest.mark.model
def test_a_conversation_holding_a_memo_is_heard_again_once_under_a_changed_runtime(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    """A changed runtime (here the batch size) changes every block's fingerprint: the
    conversation is read again once, its memo heard again from the kept WAV (in the same
    parts, at the same positions), the reason said; the next resume is exact again."""
    core = open_core()
    conversation = core.new_conversation()
    core.send(conversation, "Listen to this.", params=Params)
    added = core.add_document_file(conversation, long_memo(tmp_path, 35))
    core.send(conversation, "Noted?", params=Params)
    core.close()

    core = open_core(n_batch=256)
    reread = core.send(conversation, "What was in it?", params=Params)
    assert reread.graft is not None and reread.graft.fallback_reason  # said why
    assert reread.counters.recomputed_tokens > added.audio_tokens  # heard again, once
    assert pictures_in(core.engine.tokens) == [0, 1]
    core.close()

    core = open_core(n_batch=256)
    resumed = core.send(conversation, "And again?", params=Params)
    assert resumed.graft is not None and resumed.graft.proof.verdict == "exact"
    assert resumed.counters.recomputed_tokens == 0


@pytest.mark.model
def test_a_model_whose_projector_cannot_hear_refuses_a_memo(
    tmp_path: Path, vision_model: Path, open_core: Callable[..., Galahad]
) -> None:
    """The vision-only test projector (as 26B-A4B and 31B have): a clear refusal before the
    file is read, nothing stored; `info` says it."""
    core = open_core(model=vision_model)
    status = core.vision_status()
    assert status.pictures and not status.audio
    memo = spoken(tmp_path, "Call the plumber.")
    with pytest.raises(InputError, match="cannot hear"):
        core.deposit(memo)
    conversation = core.new_conversation()
    core.send(conversation, "Hello.", params=Params)
    with pytest.raises(InputError, match="cannot hear"):
        core.add_document_file(conversation, memo)
    assert core.list_documents() == []
    assert len(core.messages(conversation)) == 2


@pytest.mark.model
def test_hostile_memos_store_nothing(tmp_path: Path, open_core: Callable[..., Galahad]) -> None:
    core = open_core()
    memo = spoken(tmp_path, "The gate code is four four two one.")
    mp3 = tmp_path / "gate.mp3"
    convert_audio(memo, mp3, "libmp3lame")
    cut = tmp_path / "cut.mp3"
    cut.write_bytes(mp3.read_bytes()[: mp3.stat().st_size // 3])
    wrong = tmp_path / "wrong.flac"
    wrong.write_bytes(mp3.read_bytes())
    silence = tmp_path / "silence.wav"
    silence.write_bytes(Sound.from_pcm(bytes(SOUND_RATE * 4)).wav)
    empty = tmp_path / "empty.ogg"
    empty.write_bytes(b"")
    for path, reason in (
        (cut, "cut short|damaged"),
        (wrong, "not a FLAC|damaged"),
        (silence, "only silence"),
        (empty, "empty"),
    ):
        with pytest.raises(InputError, match=reason):
            core.deposit(path)
    assert core.list_documents() == []
    assert core.deposit(mp3).sounds == 1  # the same memo, whole, is heard


@pytest.mark.model
def test_memo_blocks_are_stored_under_the_projector_and_audio_fingerprint(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    core = open_core()
    deposited = core.deposit(spoken(tmp_path, "Buy bread."))
    block = core.vault.records.block(deposited.block_id)
    assert block is not None
    vision = core.live.hearing()
    assert block["fingerprint"] == vision.fingerprint != core.engine.fingerprint
    assert vision.details["audio_sample_rate"] == SOUND_RATE
