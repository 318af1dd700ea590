"""Pictures and sounds read into the context through the model's projector (llama.cpp's mtmd).

A picture becomes the model's own markers around a run of image embeddings (Gemma 4:
`<|image>` … `<image|>`), a voice memo the same around a run of audio embeddings (`<|audio>`
… `<audio|>`, on the sizes that hear: E2B, E4B), evaluated at the context's next positions
like any tokens. The markers are tokens in the ledger; the embedding positions have no token
ids, so the ledger holds a placeholder there: `-(1 + j)` for the ledger's j-th picture or
sound (negative ids are never tokens). Everything that re-reads a ledger therefore needs the
pictures and sounds themselves, in ledger order (the vault keeps each one encrypted next to
what holds it).

The projector, its file's hash, the image-token budget and (where it hears) the audio
settings change the bits a picture or sound leaves in the cache: a block holding such
positions is stored under `Vision.fingerprint` (the engine's fingerprint extended by those),
every other block under the engine's own.

Where llama.cpp lets a picture's tokens attend to each other both ways (every Gemma 4 size
but E2B/E4B), the whole picture must be evaluated in one micro-batch: a picture with more
tokens than n_ubatch is refused, never split (a split would be computed differently). Sound
is read causally, in batches like text.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd

from galahad_desktop.engine import devices
from galahad_desktop.engine import fingerprint as fp
from galahad_desktop.engine.engine import Engine
from galahad_desktop.engine.picture import MAX_PART_SECONDS, SOUND_RATE, Media, Sound
from galahad_desktop.engine.picture import SEES_NOTHING as SEES_NOTHING
from galahad_desktop.engine.picture import LedgerRead as LedgerRead
from galahad_desktop.engine.picture import cannot_hear as cannot_hear
from galahad_desktop.engine.picture import holds_pictures as holds_pictures
from galahad_desktop.engine.picture import picture_index as picture_index
from galahad_desktop.engine.picture import pictures_in as pictures_in
from galahad_desktop.engine.picture import placeholder as placeholder
from galahad_desktop.errors import InputError, ModelError
from galahad_desktop.jobs import NO_JOB, Job

CHUNK_TEXT = 0


@mtmd.mtmd_helper_post_decode_callback  # type: ignore[untyped-decorator]
def _no_callback(batch: Any, user_data: Any) -> int:  # pragma: no cover - never called
    return 0


class Vision:
    """One projector attached to one engine's model. Owned by the engine's thread."""

    def __init__(
        self,
        engine: Engine,
        projector: Path,
        min_tokens: int,
        max_tokens: int,
        hash_cache: Path | None = None,
    ) -> None:
        projector = Path(projector)
        if not projector.is_file():
            raise InputError(f"The projector file {projector} does not exist.")
        with open(projector, "rb") as handle:
            if handle.read(4) != b"GGUF":
                raise InputError(f"{projector} is not a GGUF projector file.")
        if min_tokens > max_tokens:
            raise InputError("image_min_tokens is larger than image_max_tokens.")
        self.engine = engine
        self.path = projector
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = engine.gpu_layers > 0
        params.n_threads = engine.config.n_threads
        params.print_timings = False
        params.warmup = False
        params.image_min_tokens = min_tokens
        params.image_max_tokens = max_tokens
        mtmd.mtmd_helper_log_set(devices.log_callback(), ctypes.c_void_p(0))
        with devices.captured_log() as log:
            self._ctx = mtmd.mtmd_init_from_file(
                str(projector).encode(), engine.model.handle, params
            )
        if not self._ctx:
            reason = next((line.strip() for line in log if "error" in line.lower()), "")
            raise ModelError(
                f"llama.cpp could not load the projector {projector.name}"
                + (f": {reason}" if reason else "")
                + " (is it the projector made for this model?)"
            )
        self.sees = bool(mtmd.mtmd_support_vision(self._ctx))
        # Memos are decoded to 16 kHz: an encoder that hears at another rate is not used.
        self.hears = bool(mtmd.mtmd_support_audio(self._ctx)) and (
            int(mtmd.mtmd_get_audio_sample_rate(self._ctx)) == SOUND_RATE
        )
        if not self.sees and not self.hears:
            self.close()
            raise ModelError(f"{projector.name} reads neither pictures nor sound.")
        self.both_ways = self.sees and bool(mtmd.mtmd_decode_use_non_causal(self._ctx, None))
        self.details: dict[str, Any] = {
            "projector_sha256": fp.model_sha256(projector, hash_cache),
            "image_min_tokens": min_tokens,
            "image_max_tokens": max_tokens,
            "attention_within_image": "both ways" if self.both_ways else "causal",
        }
        if self.hears:  # only then: a projector that cannot hear keeps its fingerprint
            self.details["audio_sample_rate"] = SOUND_RATE
            self.details["audio_part_seconds"] = int(MAX_PART_SECONDS)
        self.fingerprint = fp.runtime_fingerprint(
            {**engine.fingerprint_details.as_dict(), "vision": self.details}
        )

    # -- reading -------------------------------------------------------------------------
    def ledger(self, item: Media, index: int) -> list[int]:
        """The picture or sound as a ledger holds it: the model's markers as tokens and
        `placeholder(index)` at each embedding position (nothing is evaluated)."""
        chunks = self._tokenize(item)
        out: list[int] = []
        try:
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                if mtmd.mtmd_input_chunk_get_type(chunk) == CHUNK_TEXT:
                    out += _text_tokens(chunk)
                else:
                    out += [placeholder(index)] * int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
        return out

    def _bitmap(self, item: Media) -> Any:
        if isinstance(item, Sound):
            if not self.hears:
                raise cannot_hear()
            samples = item.samples
            if len(samples) > MAX_PART_SECONDS * SOUND_RATE:  # one read of the encoder
                raise InputError(
                    f"A part of a voice memo lasts {item.seconds:.0f} s; parts are cut at "
                    f"{MAX_PART_SECONDS:.0f} s at most."
                )
            data = samples.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            bitmap = mtmd.mtmd_bitmap_init_from_audio(len(samples), data)
            if not bitmap:
                raise InputError("llama.cpp could not take the memo's sound.")
            return bitmap
        if not self.sees:
            raise InputError(SEES_NOTHING)
        pixels = (ctypes.c_ubyte * len(item.rgb)).from_buffer_copy(item.rgb)
        bitmap = mtmd.mtmd_bitmap_init(item.width, item.height, pixels)
        if not bitmap:
            raise InputError("llama.cpp could not take the picture's pixels.")
        return bitmap

    def _tokenize(self, item: Media) -> Any:
        bitmap = self._bitmap(item)
        chunks = mtmd.mtmd_input_chunks_init()
        marker = mtmd.mtmd_default_marker()
        text = mtmd.mtmd_input_text()
        text.text = marker
        text.text_len = len(marker)
        text.add_special = False
        text.parse_special = True
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        try:
            status = mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text), bitmaps, 1)
        finally:
            mtmd.mtmd_bitmap_free(bitmap)
        if status != 0:
            mtmd.mtmd_input_chunks_free(chunks)
            what = "memo" if isinstance(item, Sound) else "picture"
            raise InputError(f"llama.cpp could not prepare the {what} (code {status}).")
        return chunks

    def _embed(self, chunk: Any, index: int) -> tuple[int, float, float]:
        engine = self.engine
        n = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
        if n_pos != n:
            raise ModelError("This projector places pictures in 2-D positions; not supported.")
        one_batch = min(engine.config.n_batch, engine.config.n_ubatch)
        both_ways = bool(mtmd.mtmd_decode_use_non_causal(self._ctx, chunk))
        if both_ways and n > one_batch:
            raise InputError(
                f"The picture takes {n} tokens, more than one {one_batch}-token batch; its "
                "tokens attend to each other both ways, so it must be read in one. Raise "
                "n_batch and n_ubatch, or lower image_max_tokens."
            )
        start = time.perf_counter()
        if mtmd.mtmd_encode_chunk(self._ctx, chunk) != 0:
            raise ModelError("The projector's encoder failed on this picture or memo.")
        embeddings = mtmd.mtmd_get_output_embd(self._ctx)
        encoded = time.perf_counter()
        n_past = len(engine.tokens)
        new_n_past = llama_cpp.llama_pos(0)
        status = engine.calls.call(  # the decode may reach a device server
            mtmd.mtmd_helper_decode_image_chunk,
            self._ctx,
            engine.context.handle,
            chunk,
            embeddings,
            n_past,
            0,
            n if both_ways else engine.config.n_batch,
            ctypes.byref(new_n_past),
            _no_callback,
            None,
        )
        if status != 0 or new_n_past.value != n_past + n:
            engine.reset()
            raise ModelError(f"llama.cpp could not evaluate the embeddings (code {status}).")
        engine.tokens.extend([placeholder(index)] * n)
        engine.decoded_tokens += n
        done = time.perf_counter()
        return n, (encoded - start) * 1e3, (done - encoded) * 1e3

    def evaluate(
        self,
        tokens: Sequence[int],
        pictures: Mapping[int, Media],
        job: Job = NO_JOB,
    ) -> LedgerRead:
        """Evaluate a ledger that holds pictures or sounds after what the context holds: its
        tokens as tokens, each run of placeholders from its picture or sound (which must take
        as many positions as the ledger gives it: a changed budget makes another ledger)."""
        start = time.perf_counter()
        out = LedgerRead()
        offset = 0
        while offset < len(tokens):
            index = picture_index(tokens[offset])
            end = offset
            if index is None:
                while end < len(tokens) and tokens[end] >= 0:
                    end += 1
                self.engine.evaluate(tokens[offset:end], job)
                offset = end
                continue
            while end < len(tokens) and tokens[end] == tokens[offset]:
                end += 1
            if index not in pictures:
                raise ModelError(
                    "A stored picture or memo is missing; its memory cannot be read again."
                )
            item = pictures[index]
            chunks = self._tokenize(item)
            try:
                for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                    job.check()
                    chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                    if mtmd.mtmd_input_chunk_get_type(chunk) == CHUNK_TEXT:
                        continue  # the markers are the ledger's own tokens around the run
                    if int(mtmd.mtmd_input_chunk_get_n_tokens(chunk)) != end - offset:
                        raise InputError(
                            "A picture now takes another number of tokens (the projector or its "
                            "budget changed); it is read again as a new memory instead."
                        )
                    n, encode_ms, _decode_ms = self._embed(chunk, index)
                    if isinstance(item, Sound):
                        out.audio_tokens += n
                    else:
                        out.image_tokens += n
                    out.encode_ms += encode_ms
            finally:
                mtmd.mtmd_input_chunks_free(chunks)
            if isinstance(item, Sound):
                out.sounds += 1
            else:
                out.pictures += 1
            offset = end
        out.elapsed_ms = (time.perf_counter() - start) * 1e3
        return out

    def close(self) -> None:
        if self._ctx:
            mtmd.mtmd_free(self._ctx)
            self._ctx = None


def _text_tokens(chunk: Any) -> list[int]:
    count = ctypes.c_size_t(0)
    pointer = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
    return [int(pointer[i]) for i in range(count.value)]
