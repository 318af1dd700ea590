"""Chat exports in other apps' formats, written from the formats' public documentation and
real exports' shapes: at least two conversations, a branch in the ChatGPT tree, non-ASCII
text, an empty conversation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The current branch of each ChatGPT conversation (what `galahad show` must print).
CHATGPT_BRANCHES = [
    (
        "Croissants à Paris",
        [
            ("user", "Où trouver les meilleurs croissants à Paris ?"),
            ("model", "Essayez une boulangerie du Marais, tôt le matin. 🥐"),
            ("user", "Et le dimanche ?"),
            ("model", "Beaucoup ferment le lundi, pas le dimanche."),
        ],
    ),
    (
        "日本語の質問",
        [
            ("user", "富士山の高さは？"),
            ("model", "富士山の高さは3,776メートルです。"),
        ],
    ),
]


def _node(
    node_id: str,
    parent: str | None,
    children: list[str],
    role: str | None,
    text: str | None,
    t: float,
) -> dict[str, Any]:
    message = None
    if role is not None:
        message = {
            "id": node_id,
            "author": {"role": role, "name": None, "metadata": {}},
            "create_time": t,
            "content": {"content_type": "text", "parts": [text]},
            "status": "finished_successfully",
            "metadata": {"is_visually_hidden_from_conversation": role == "system"},
        }
    return {"id": node_id, "message": message, "parent": parent, "children": children}


def chatgpt_export(path: Path) -> Path:
    """conversations.json as ChatGPT's data export writes it: a list of conversations, each a
    message tree (`mapping`) whose `current_node` ends the branch the user last saw."""
    (title1, c1), (title2, c2) = CHATGPT_BRANCHES
    first = {
        "title": title1,
        "create_time": 1_700_000_000.0,
        "update_time": 1_700_000_900.0,
        "mapping": {
            "root": _node("root", None, ["sys"], None, None, 0),
            "sys": _node("sys", "root", ["u1"], "system", "", 1_700_000_000),
            "u1": _node("u1", "sys", ["a1"], "user", c1[0][1], 1_700_000_010),
            "a1": _node("a1", "u1", ["u2-old", "u2"], "assistant", c1[1][1], 1_700_000_020),
            # an edited question: the old branch is not the current one
            "u2-old": _node("u2-old", "a1", ["a2-old"], "user", "Et le lundi ?", 1_700_000_030),
            "a2-old": _node("a2-old", "u2-old", [], "assistant", "Non.", 1_700_000_040),
            "u2": _node("u2", "a1", ["a2"], "user", c1[2][1], 1_700_000_050),
            "a2": _node("a2", "u2", [], "assistant", c1[3][1], 1_700_000_060),
        },
        "current_node": "a2",
        "conversation_id": "11111111-1111",
    }
    second = {
        "title": title2,
        "create_time": 1_700_100_000.0,
        "update_time": 1_700_100_100.0,
        "mapping": {
            "r": _node("r", None, ["q"], None, None, 0),
            "q": _node("q", "r", ["a"], "user", c2[0][1], 1_700_100_010),
            "a": _node("a", "q", [], "assistant", c2[1][1], 1_700_100_020),
        },
        "current_node": "a",
    }
    empty = {
        "title": "Empty chat",
        "create_time": 1_700_200_000.0,
        "update_time": 1_700_200_000.0,
        "mapping": {"r": _node("r", None, [], None, None, 0)},
        "current_node": "r",
    }
    path.write_text(json.dumps([first, second, empty], ensure_ascii=False), "utf-8")
    return path


def jan_folder(root: Path) -> Path:
    """Jan's data folder: threads/<id>/thread.json and messages.jsonl (one message a line,
    content as a list of {"type": "text", "text": {"value": ...}})."""
    for thread_id, title, pairs in (
        ("jan_1", "Grüße", [("Wie geht's?", "Gut, danke! Und dir?")]),
        ("jan_2", "Math", [("What is 2+2?", "4."), ("And 3+3?", "6.")]),
    ):
        folder = root / "threads" / thread_id
        folder.mkdir(parents=True)
        (folder / "thread.json").write_text(
            json.dumps(
                {
                    "id": thread_id,
                    "object": "thread",
                    "title": title,
                    "created": 1_710_000_000,
                    "updated": 1_710_000_500,
                }
            ),
            "utf-8",
        )
        lines = []
        for index, (question, answer) in enumerate(pairs):
            for role, text in (("user", question), ("assistant", answer)):
                lines.append(
                    json.dumps(
                        {
                            "id": f"{thread_id}-{index}-{role}",
                            "thread_id": thread_id,
                            "role": role,
                            "created_at": 1_710_000_000_000 + index * 1000,
                            "content": [
                                {"type": "text", "text": {"value": text, "annotations": []}}
                            ],
                        },
                        ensure_ascii=False,
                    )
                )
        (folder / "messages.jsonl").write_text("\n".join(lines) + "\n", "utf-8")
    return root


def lm_studio_file(path: Path) -> Path:
    """An LM Studio conversation: messages with versions; the selected one counts."""
    data = {
        "name": "Haiku",
        "createdAt": 1_720_000_000_000,
        "messages": [
            {
                "versions": [
                    {
                        "type": "singleStep",
                        "role": "user",
                        "content": [{"type": "text", "text": "Write a haiku about rain."}],
                    }
                ],
                "currentlySelected": 0,
            },
            {
                "versions": [
                    {
                        "type": "multiStep",
                        "role": "assistant",
                        "steps": [
                            {
                                "type": "contentBlock",
                                "content": [{"type": "text", "text": "Old draft."}],
                            }
                        ],
                    },
                    {
                        "type": "multiStep",
                        "role": "assistant",
                        "steps": [
                            {
                                "type": "contentBlock",
                                "content": [
                                    {
                                        "type": "text",
                                        "text": "Soft rain on the roof\nthe kettle begins to sing",
                                    }
                                ],
                            }
                        ],
                    },
                ],
                "currentlySelected": 1,
            },
        ],
    }
    path.write_text(json.dumps(data), "utf-8")
    return path


def open_webui_file(path: Path) -> Path:
    """Open WebUI's "Export chats" JSON: a list of chats with a history tree."""
    data = [
        {
            "id": "owui-1",
            "title": "Rust lifetimes",
            "created_at": 1_730_000_000,
            "updated_at": 1_730_000_600,
            "chat": {
                "title": "Rust lifetimes",
                "history": {
                    "currentId": "m2",
                    "messages": {
                        "m1": {
                            "id": "m1",
                            "parentId": None,
                            "childrenIds": ["m2"],
                            "role": "user",
                            "content": "What does 'a mean?",
                            "timestamp": 1_730_000_010,
                        },
                        "m2": {
                            "id": "m2",
                            "parentId": "m1",
                            "childrenIds": [],
                            "role": "assistant",
                            "content": "A lifetime parameter.",
                            "timestamp": 1_730_000_020,
                        },
                    },
                },
                "messages": [],
            },
        }
    ]
    path.write_text(json.dumps(data), "utf-8")
    return path


def markdown_file(path: Path) -> Path:
    path.write_text(
        "# Tea\n\n## User\n\nHow long do I steep green tea?\n\n## Assistant\n\n"
        "About two minutes, at 80 °C.\n",
        "utf-8",
    )
    return path
