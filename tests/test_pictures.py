"""Pictures and scans (#24): read once through Gemma 4's vision projector into encrypted KV
blocks, grafted back with 0 recomputed tokens and an exact proof, in documents and inside
chained conversations; hostile files refused in the limited child, nothing stored.

The model tier runs the Gemma 4 test model with its test projector (galahad_dev/
gemma4_projector.py: the real gemma4v layout for llama.cpp's loader, random weights), built
next to the model, where Galahad finds a projector on its own."""

from __future__ import annotations

import hashlib
import sqlite3
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from galahad_desktop.engine.picture import Picture
from galahad_desktop.engine.sampling import SamplingParams
from galahad_desktop.engine.vision import holds_pictures, pictures_in, placeholder
from galahad_desktop.errors import InputError, IntegrityError
from galahad_desktop.memory.documents.pictures import (
    MAX_SIDE,
    check_picture_file,
    read_pictures_bounded,
)
from galahad_desktop.memory.galahad import Galahad
from galahad_desktop.models import catalog
from tests.fakehub import FakeHub
from tests.helpers import (
    ask_grafts_exactly,
    cli_json,
    media_cores,
    on_the_real_keyring,
    photo,
    resumes_from_its_blocks,
    run_cli,
)

Params = SamplingParams(max_tokens=6, temperature=0.0, seed=1)


def scan(path: Path, pages: int = 2) -> Path:
    """A PDF of page images and no text layer, as a scanner writes one."""
    images = []
    for number in range(pages):
        page = Image.new("RGB", (850, 1100), "white")
        ImageDraw.Draw(page).rectangle((100, 100 + 250 * number, 700, 300 + 250 * number), "black")
        images.append(page)
    images[0].save(path, save_all=True, append_images=images[1:])
    return path


def png_declaring(path: Path, width: int, height: int) -> Path:
    """A PNG whose header declares width × height, with almost no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + data)
    return path


def hostile_files(folder: Path) -> dict[str, tuple[Path, str]]:
    """Each hostile file and a phrase its refusal must contain."""
    whole = photo(folder / "whole.png").read_bytes()
    truncated = folder / "truncated.png"
    truncated.write_bytes(whole[: len(whole) // 3])
    not_a_picture = folder / "notes.jpg"
    not_a_picture.write_bytes(b"Dear diary, today I bought bread.\n" * 20)
    jpeg_named_png = folder / "holiday.png"
    Image.new("RGB", (64, 64), "red").save(jpeg_named_png, format="JPEG")
    return {
        "truncated": (truncated, "truncated"),
        "bomb": (png_declaring(folder / "bomb.png", 30_000, 30_000), "30,000×30,000"),
        "text": (not_a_picture, "not a picture"),
        "mislabelled": (jpeg_named_png, "not a PNG"),
    }


# -- fast tier: the limited child's checks ------------------------------------------------
@pytest.mark.model  # seconds of work: the full suite's, not the fast tier's
def test_a_picture_is_checked_and_scaled_in_the_child(tmp_path: Path) -> None:
    big = photo(tmp_path / "big.png", (3000, 1000))
    [picture] = read_pictures_bounded(big)
    assert (picture.width, picture.height) == (MAX_SIDE, round(1000 * MAX_SIDE / 3000))
    assert len(picture.rgb) == picture.width * picture.height * 3
    assert Picture.from_png(picture.png).rgb == picture.rgb  # what a re-read decodes
    gif = tmp_path / "anim.gif"
    frames = [Image.new("RGB", (40, 30), colour) for colour in ("blue", "yellow")]
    frames[0].save(gif, save_all=True, append_images=frames[1:])
    [first] = read_pictures_bounded(gif)
    assert first.rgb[:3] == bytes((0, 0, 255))  # the first frame


@pytest.mark.parametrize("kind", ["truncated", "bomb", "text", "mislabelled"])
def test_hostile_pictures_are_refused_with_a_reason(tmp_path: Path, kind: str) -> None:
    path, phrase = hostile_files(tmp_path)[kind]
    with pytest.raises(InputError) as refused:
        read_pictures_bounded(path)
    assert phrase in str(refused.value) and path.name in str(refused.value)


def test_a_scan_is_rendered_page_by_page(tmp_path: Path) -> None:
    pages = read_pictures_bounded(scan(tmp_path / "letter.pdf", 3), "scan")
    assert len(pages) == 3
    assert len({page.sha256 for page in pages}) == 3  # each page its own picture
    assert all(max(p.width, p.height) <= MAX_SIDE for p in pages)


def test_ledger_placeholders_name_their_picture() -> None:
    ledger = [2, 105, *[placeholder(0)] * 4, 7, *[placeholder(1)] * 3, 8]
    assert holds_pictures(ledger) and not holds_pictures([2, 105, 7])
    assert pictures_in(ledger) == [0, 1]


def test_a_text_engine_says_it_reads_no_pictures(
    tmp_path: Path, make_fake_core: Callable[..., Galahad]
) -> None:
    core = make_fake_core()
    with pytest.raises(InputError, match="reads no pictures"):
        core.deposit(photo(tmp_path / "cat.png"))
    assert core.list_documents() == []


# -- model tier: the Gemma 4 test model and its test projector ---------------------------
@pytest.fixture()
def open_core(tmp_path: Path, vision_model: Path) -> Any:
    with media_cores(tmp_path / "data", vision_model) as factory:
        yield factory


@on_the_real_keyring
def test_a_picture_deposited_and_asked_from_new_processes(
    tmp_path: Path, vision_model: Path
) -> None:
    data = tmp_path / "data"
    info = cli_json("info", data_dir=data, model=vision_model)
    assert info["vision"]["pictures"] and info["vision"]["projector"].endswith(".gguf")
    deposited = cli_json(
        "deposit", str(photo(tmp_path / "photo.png")), data_dir=data, model=vision_model
    )
    assert deposited["pictures"] == 1 and 70 <= deposited["image_tokens"] <= 280
    assert deposited["tokens"] > deposited["image_tokens"]  # the header, markers and reply
    ask_grafts_exactly(
        deposited, "What colour is the sky in the photo?", data, vision_model, "picture"
    )


@pytest.mark.model
def test_a_picture_in_a_chained_conversation_resumes_exactly(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    core = open_core()
    conversation = core.new_conversation()
    core.send(conversation, "I will show you my garden.", params=Params)
    added = core.add_document_file(conversation, photo(tmp_path / "garden.png"))
    assert added.image_tokens >= 70 and added.counters.recomputed_tokens == 0
    core.send(conversation, "And this is the second picture:", params=Params)
    second = core.add_document_file(conversation, photo(tmp_path / "pond.png", seed=9))
    assert second.image_tokens >= 70
    last = core.send(conversation, "Which do you like more?", params=Params)
    core.close()

    core = open_core()  # a new engine: everything comes back from the blocks
    resumes_from_its_blocks(
        core, conversation, "Describe the first one.", last, added.image_tokens, Params
    )
    messages = core.messages(conversation)
    pictures = [m.picture for m in messages if m.picture]
    assert len(pictures) == 2 and all(p.startswith(b"\x89PNG") for p in pictures)


@pytest.mark.model
def test_a_tampered_picture_block_is_refused(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    core = open_core()
    deposited = core.deposit(photo(tmp_path / "receipt.png"))
    block_file = next((tmp_path / "data" / "blocks").glob(f"{deposited.block_id}*.gkv"))
    raw = bytearray(block_file.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    block_file.write_bytes(bytes(raw))
    core.close()
    core = open_core()
    conversation = core.new_conversation(document_id=deposited.document_id)
    with pytest.raises(IntegrityError):
        core.send(conversation, "What is the total?", params=Params)
    assert [d.id for d in core.list_documents()] == [deposited.document_id]


@pytest.mark.model
def test_a_picture_taken_out_of_the_catalog_is_noticed(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    core = open_core()
    deposited = core.deposit(photo(tmp_path / "id-card.png"))
    conversation = core.new_conversation()
    core.send(conversation, "Hello.", params=Params)
    core.add_document_file(conversation, photo(tmp_path / "receipt.png", seed=4))
    with pytest.raises(InputError, match=r"picture 'receipt\.png'"):
        core.continue_with_recent(conversation, "Go on.")  # refused, said why
    core.close()
    catalog = sqlite3.connect(tmp_path / "data" / "catalog.sqlite")
    with catalog:  # what someone with write access to the catalog can do
        catalog.execute("UPDATE parts SET image_enc = NULL")
        catalog.execute("UPDATE messages SET image_enc = NULL")
    catalog.close()
    core = open_core()
    problems = core.audit().problems
    assert any("document part" in p for p in problems), problems
    assert any("conversation" in p for p in problems), problems
    with pytest.raises(IntegrityError):
        core.messages(conversation)
    with pytest.raises(IntegrityError):
        core.document_picture(deposited.document_id)  # the thumbnail, or a re-read


@pytest.mark.model
def test_hostile_pictures_store_nothing(tmp_path: Path, open_core: Callable[..., Galahad]) -> None:
    core = open_core()
    blocks = tmp_path / "data" / "blocks"
    before = sorted(blocks.iterdir()) if blocks.exists() else []
    for path, phrase in hostile_files(tmp_path).values():
        with pytest.raises(InputError, match=phrase):
            core.deposit(path)
    assert core.list_documents() == []
    assert (sorted(blocks.iterdir()) if blocks.exists() else []) == before


@pytest.mark.model
def test_a_picture_larger_than_one_batch_is_refused_not_split(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    """The test projector's tokens attend both ways within a picture (as on 26B/31B): a
    picture of more tokens than one micro-batch would be computed differently if split."""
    core = open_core(image_max_tokens=1120)  # n_batch and n_ubatch stay 512
    with pytest.raises(InputError, match="one 512-token batch"):
        core.deposit(photo(tmp_path / "poster.png", (2048, 1536)))
    assert core.list_documents() == []
    core.close()
    wide = open_core(image_max_tokens=1120, n_batch=2048, n_ubatch=2048)
    deposited = wide.deposit(photo(tmp_path / "poster.png", (2048, 1536)))
    assert deposited.image_tokens > 512


@pytest.mark.model
def test_a_scanned_pdf_page_is_routed_to(tmp_path: Path, open_core: Callable[..., Galahad]) -> None:
    core = open_core()
    deposited = core.deposit(scan(tmp_path / "invoice.pdf", 2))
    assert deposited.n_parts == 2 and deposited.pictures == 2
    [summary] = core.list_documents()
    assert summary.kind == "scan"
    assert core.document_picture(deposited.document_id, 2) is not None
    asked = core.ask("Page 2 of the invoice scan?", deposited.document_id, params=Params)
    best = asked.decision.best
    assert best is not None and best.part_no == 2  # the page's words (name and number)
    answered = core.ask(
        "What is the invoice total?", deposited.document_id, best.part_id, params=Params
    )
    assert answered.answered and answered.graft is not None
    assert answered.graft.proof.verdict == "exact" and answered.graft.recomputed_tokens == 0


@pytest.mark.model
def test_a_changed_picture_budget_reads_the_picture_again_once(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    core = open_core()
    deposited = core.deposit(photo(tmp_path / "whiteboard.png", (1600, 1200)))
    assert deposited.image_tokens > 140
    core.close()
    core = open_core(image_max_tokens=140)
    conversation = core.new_conversation(document_id=deposited.document_id)
    first = core.send(conversation, "What is written?", params=Params)
    assert first.graft is not None and first.graft.fallback_reason  # said why
    assert first.counters.recomputed_tokens < deposited.tokens  # fewer image tokens now
    again = core.new_conversation(document_id=deposited.document_id)
    second = core.send(again, "What is written?", params=Params)
    assert second.graft is not None and second.graft.proof.verdict == "exact"
    assert second.counters.recomputed_tokens == 0


@pytest.mark.model
def test_the_command_refuses_a_picture_without_a_projector(tmp_path: Path) -> None:
    """The embedded text model has no projector: a clear message and exit code, no
    traceback, nothing stored."""
    proc = run_cli(
        "deposit",
        str(photo(tmp_path / "cat.png")),
        "--passphrase",
        data_dir=tmp_path / "data",
        check=False,
        env={
            "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
            "GALAHAD_PASSPHRASE": "correct horse battery",
        },
    )
    assert proc.returncode != 0 and "reads no pictures" in proc.stderr
    assert "Traceback" not in proc.stderr


@on_the_real_keyring
def test_the_catalog_gets_a_model_with_its_projector(tmp_path: Path, vision_model: Path) -> None:
    from galahad_dev.gemma4_projector import build

    data = tmp_path / "data"
    e2b = catalog.model_for("E2B")
    projector = build(out_dir=vision_model.parent).read_bytes()
    with FakeHub(
        e2b.repo, e2b.file, vision_model.read_bytes(), more={e2b.projector: projector}
    ) as hub:
        got = cli_json(
            "models",
            "get",
            "gemma-4",
            "--size",
            "E2B",
            "--vision",
            "--use",
            data_dir=data,
            env={"HF_ENDPOINT": hub.endpoint},
        )
    assert got["in_use"] and got["projector"]["bytes"] == len(projector)
    info = cli_json("info", data_dir=data)  # settings name the model and its projector
    assert info["vision"]["pictures"]
    assert info["vision"]["projector"] == got["projector"]["path"]
    deposited = cli_json("deposit", str(photo(tmp_path / "map.png")), data_dir=data)
    assert deposited["pictures"] == 1 and deposited["image_tokens"] >= 70


@pytest.mark.model
def test_picture_blocks_are_verified_under_their_own_fingerprint(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    core = open_core()
    deposited = core.deposit(photo(tmp_path / "receipt.png"))
    core.deposit_text("notes.txt", "The harbour ledger lists boats and nets.")
    results = core.verify()
    assert len(results) == 2 and all(r.proof == "exact" for r in results), results
    picture = core.verify(deposited.document_id)
    assert picture[0].fingerprint_matches and picture[0].proof == "exact"


@pytest.mark.model  # slow for the fast tier: it starts processes (runs in the full suite)
def test_a_tiny_file_declaring_a_huge_picture_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="declares 8,000×8,000 pixels in only"):
        check_picture_file(png_declaring(tmp_path / "huge.png", 8000, 8000))
    assert check_picture_file(photo(tmp_path / "real.png", (2400, 1800)))  # a real one passes


@pytest.mark.model
def test_a_picture_sent_through_the_api_is_read_once(
    tmp_path: Path, open_core: Callable[..., Galahad]
) -> None:
    """An OpenAI client's data-URL picture: checked in the child (bytes through a pipe,
    never a file), read through the projector as its own turn, found again with the
    history that resends it: the next call reads only its new message."""
    from galahad_desktop.memory.results import ChatMessage

    core = open_core()
    png = photo(tmp_path / "sent.png").read_bytes()
    asked = ChatMessage("user", "What is in this picture?", (("png", png),))
    first = core.complete_chat([asked], max_tokens=6)
    assert first.turn.counters.new_tokens > 0 and first.cached_tokens == 0
    names = [m.text for m in core.messages(first.conversation_id) if m.picture is not None]
    assert names == [f"picture-{hashlib.sha256(png).hexdigest()[:12]}.png"]
    core.close()
    again = open_core()
    second = again.complete_chat(
        [asked, ChatMessage("assistant", first.text), ChatMessage("user", "And its colours?")],
        max_tokens=6,
    )
    assert second.conversation_id == first.conversation_id and second.matched_turns == 1
    assert second.turn.graft is not None and second.turn.graft.proof.verdict == "exact"
    assert second.read_tokens < 40 <= second.cached_tokens  # the picture was not read again
    for path in (tmp_path / "data").rglob("*"):
        assert not path.is_file() or png[100:164] not in path.read_bytes()
    # A different picture under the same words is a different history.
    other = ChatMessage("user", "What is in this picture?", (("png", png[: len(png) // 2]),))
    with pytest.raises(InputError):
        again.complete_chat([other], max_tokens=4)  # a damaged PNG: refused by the child


def test_a_text_model_refuses_a_picture_through_the_api(
    make_fake_core: Callable[..., Galahad], tmp_path: Path
) -> None:
    from galahad_desktop.memory.results import ChatMessage

    core = make_fake_core()
    png = photo(tmp_path / "p.png", (32, 32)).read_bytes()
    with pytest.raises(InputError, match="projector"):
        core.complete_chat([ChatMessage("user", "See?", (("png", png),))], max_tokens=4)
    assert core.list_conversations() == []
