"""The window's look and what it shows of memory: theme and font, the Memory panel, the proof
of the last restore in plain words, pinned conversations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QDockWidget, QMainWindow

from galahad_desktop.memory.results import (
    ConversationSummary,
    GiveBackResult,
    GraftReport,
    MemoryStats,
)
from galahad_desktop.ui import theme
from galahad_desktop.ui.format import human_bytes, proof_words, short_title
from galahad_desktop.ui.memory_panel import MemoryPanel
from galahad_desktop.ui.worker import CONVERSATIONS, DOCUMENTS

if TYPE_CHECKING:
    from PySide6.QtCore import QSettings
    from PySide6.QtGui import QAction

    from galahad_desktop.ui.chat_view import ChatView
    from galahad_desktop.ui.prompts import Prompts
    from galahad_desktop.ui.sidebar import Sidebar
    from galahad_desktop.ui.worker import CoreBridge


class LookActions:
    """Mixed into MainWindow: these are the window's own widgets and methods."""

    if TYPE_CHECKING:
        bridge: CoreBridge
        chat: ChatView
        sidebar: Sidebar
        prompts: Prompts
        ui_settings: QSettings
        conversation_id: str | None
        last_graft: GraftReport | None
        memory_action: QAction

        def show_error(self, message: str, kind: str = "") -> None: ...
        def set_status(self, text: str) -> None: ...
        def open_memory(self) -> None: ...
        def refresh_lists(self) -> None: ...

    def _build_memory_panel(self) -> None:
        window = cast("QMainWindow", self)
        self.memory_panel = MemoryPanel()
        self.memory_panel.proof_requested.connect(self.show_proof)
        self.memory_panel.details_requested.connect(self.open_memory)
        self.memory_dock = QDockWidget("Memory", window)
        self.memory_dock.setObjectName("memory-dock")
        self.memory_dock.setAccessibleName("Memory")
        self.memory_dock.setWidget(self.memory_panel)
        self.memory_dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetClosable)
        window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.memory_dock)
        self.memory_dock.setVisible(bool(self.ui_settings.value("memory_panel", False) == "true"))
        self.memory_dock.visibilityChanged.connect(self._memory_panel_shown)

    # -- look ----------------------------------------------------------------------------
    def _apply_theme(self) -> None:
        app = QApplication.instance()
        if isinstance(app, QApplication):
            theme.apply(
                app,
                str(self.ui_settings.value("theme", "system")),
                int(str(self.ui_settings.value("font_size", 0) or 0)),
            )
        # Every card is drawn again in the new colours: the reader stays where they were.
        bar = self.chat.transcript.verticalScrollBar()
        at_end, position = bar.value() >= bar.maximum() - 8, bar.value()
        self.chat.redraw()
        bar.setValue(bar.maximum() if at_end else position)

    def set_theme(self, name: str) -> None:
        self.ui_settings.setValue("theme", name)
        self._apply_theme()
        self.sidebar.conversation_list.viewport().update()

    def toggle_theme(self) -> None:
        self.set_theme("light" if theme.current().name == "dark" else "dark")

    # -- memory made visible -------------------------------------------------------------
    def toggle_memory_panel(self) -> None:
        self.memory_dock.setVisible(not self.memory_dock.isVisible())

    def _memory_panel_shown(self, visible: bool) -> None:
        self.ui_settings.setValue("memory_panel", "true" if visible else "false")
        if hasattr(self, "memory_action"):  # not yet while the window is being built
            self.memory_action.setChecked(visible)
        if visible:
            self.refresh_memory()

    def refresh_memory(self) -> None:
        if not self.memory_dock.isVisible():
            return
        conversation_id = self.conversation_id
        self.bridge.run(
            lambda core, _job: (
                core.memory_stats(),
                core.conversation(conversation_id) if conversation_id else None,
            ),
            on_done=self._memory_shown,
            on_error=self.show_error,
        )

    def _memory_shown(self, found: tuple[MemoryStats, ConversationSummary | None]) -> None:
        stats, summary = found
        self.memory_panel.show_totals(stats)
        restore = self.last_graft if summary is not None and self._restored(summary.id) else None
        self.memory_panel.show_conversation(summary, restore)

    def _restored(self, conversation_id: str) -> bool:
        return self.last_graft is not None and self.last_graft.owner_id == conversation_id

    def show_proof(self) -> None:
        self.prompts.inform("The proof of the last restore", proof_words(self.last_graft))

    def storage_action(self, item_id: str, action: str) -> None:
        """Keep an item's memory on disk, let it go again, or give its disk space back now
        (its messages stay; the next open re-reads it once)."""
        if action == "give back" and self.conversation_id == item_id:
            self.show_error("This conversation is open; open another one first.")
            return

        def run(core: Any, _job: Any) -> str:
            if action == "give back":
                done = core.give_back(item_id)
                return (
                    f"Gave back {human_bytes(done.bytes_freed)} "
                    f"({done.blocks} block{'s' if done.blocks != 1 else ''}); "
                    "its messages stay and it is read again when next opened"
                )
            item = core.keep(item_id, action == "keep")
            return (
                f"'{item.title}' keeps its memory on disk"
                if item.kept
                else f"'{item.title}' may give its memory back when disk space runs short"
            )

        self.bridge.run(
            run,
            on_done=self.set_status,
            on_error=self.show_error,
            changes={CONVERSATIONS, DOCUMENTS},
        )

    def given_back(self, done: list[GiveBackResult], changes: frozenset[str] = frozenset()) -> None:
        """Say what the disk budget gave back; the lists refresh when the operation that
        made room did not change both (a deposit gave back a chat's memory, and its row
        still said "Stored · 825 tokens · 9.9 MB")."""
        if done and not {CONVERSATIONS, DOCUMENTS} <= changes:
            self.refresh_lists()
        if done:
            freed = human_bytes(sum(d.bytes_freed for d in done))
            # Whole names, each short enough that the status bar never cuts one part way.
            names = ", ".join(f"'{short_title(d.title)}'" for d in done[:2])
            if len(done) > 2:
                names += f" and {len(done) - 2} more"
            self.set_status(
                f"To stay within the disk budget, {names} gave back {freed}; "
                "each is read again once when next opened"
            )

    def toggle_pin(self, conversation_id: str) -> None:
        pinned = self.sidebar.pinned
        pinned.symmetric_difference_update({conversation_id})
        self.ui_settings.setValue("pinned", sorted(pinned))
        self.sidebar.fill()

    def change_font(self, delta: int) -> None:
        app = QApplication.instance()
        base = app.font().pointSize() if isinstance(app, QApplication) else 10
        size = max(7, min(28, int(str(self.ui_settings.value("font_size", 0) or base)) + delta))
        self.ui_settings.setValue("font_size", size)
        self._apply_theme()
