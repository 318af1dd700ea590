"""What the dialogs may ask of the window (so they never import it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from galahad_desktop.memory.results import EngineInfo
    from galahad_desktop.ui.prompts import Prompts
    from galahad_desktop.ui.worker import CoreBridge


class Host(Protocol):
    bridge: CoreBridge
    info: EngineInfo | None
    prompts: Prompts
    data_dir: Path

    def show_error(self, message: str, kind: str = "") -> None: ...

    def set_status(self, text: str) -> None: ...

    def engine_changed(self) -> None:
        """The model or a runtime setting changed: load the model's description again."""

    def forget_conversation(self) -> None: ...

    def settings_saved(self) -> None:
        """Settings were saved: the window takes up what it shows from them."""

    def conversation_changed(self, conversation_id: str) -> Any: ...
