"""The left side of the window: search, conversations grouped by date (rename inline, export
and delete from a context menu), and the documents."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import (
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop.memory.results import ConversationSummary, DocumentSummary
from galahad_desktop.ui.format import GROUPS, ago, date_group, human_bytes

ID_ROLE = Qt.ItemDataRole.UserRole


class Sidebar(QWidget):
    conversation_chosen = Signal(str)
    rename_requested = Signal(str, str)
    export_requested = Signal(str)
    forget_requested = Signal(str)
    search_changed = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search titles and messages (Ctrl+K)")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._search_edited)
        self.new_button = QPushButton("New chat")
        self.conversation_list = QListWidget()
        self.conversation_list.setWordWrap(True)
        self.conversation_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conversation_list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.conversation_list.customContextMenuRequested.connect(self._menu)
        self.conversation_list.itemActivated.connect(self._chosen)
        self.conversation_list.itemClicked.connect(self._chosen)
        self.conversation_list.itemChanged.connect(self._renamed)
        self.document_list = QListWidget()
        self.document_list.setWordWrap(True)
        self.document_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.add_document_button = QPushButton("Add document…")
        self.chat_document_button = QPushButton("Chat with this document")
        self.deposit_bar = QProgressBar()
        self.deposit_label = QLabel()
        self.deposit_label.setWordWrap(True)
        self.deposit_cancel = QPushButton("Cancel")
        for hidden in (self.deposit_bar, self.deposit_label, self.deposit_cancel):
            hidden.setVisible(False)
        for widget in (
            self.search,
            self.new_button,
            QLabel("<b>Conversations</b>"),
            self.conversation_list,
            QLabel("<b>Documents</b>"),
            self.document_list,
            self.add_document_button,
            self.chat_document_button,
            self.deposit_bar,
            self.deposit_label,
            self.deposit_cancel,
        ):
            layout.addWidget(widget)
        layout.setStretchFactor(self.conversation_list, 3)
        layout.setStretchFactor(self.document_list, 1)
        self.conversations: list[ConversationSummary] = []
        self.documents: list[DocumentSummary] = []
        self.matches: set[str] | None = None  # conversation ids a search found
        self.current: str | None = None
        self._filling = False

    # -- conversations -------------------------------------------------------------------
    def set_conversations(self, conversations: list[ConversationSummary]) -> None:
        self.conversations = conversations
        self.fill()

    def set_matches(self, ids: set[str] | None) -> None:
        self.matches = ids
        self.fill()

    def fill(self) -> None:
        """The list, grouped by date (Today, Yesterday, …); headers are not selectable."""
        self._filling = True
        self.conversation_list.clear()
        shown = [c for c in self.conversations if self.matches is None or c.id in self.matches]
        by_group: dict[str, list[ConversationSummary]] = {g: [] for g in GROUPS}
        for conv in shown:
            by_group[date_group(conv.updated_at)].append(conv)
        for group in GROUPS:
            if not by_group[group]:
                continue
            header = QListWidgetItem(group)
            header.setFlags(Qt.ItemFlag.NoItemFlags)
            font = header.font()
            font.setBold(True)
            header.setFont(font)
            self.conversation_list.addItem(header)
            for conv in by_group[group]:
                item = QListWidgetItem(conv.title or "New conversation")
                item.setToolTip(
                    f"{ago(conv.updated_at)} · {conv.n_tokens:,} tokens · "
                    f"{conv.n_messages} messages · F2 or double-click to rename"
                )
                item.setData(ID_ROLE, conv.id)
                item.setFlags(
                    Qt.ItemFlag.ItemIsSelectable
                    | Qt.ItemFlag.ItemIsEnabled
                    | Qt.ItemFlag.ItemIsEditable
                )
                self.conversation_list.addItem(item)
                if conv.id == self.current:
                    item.setSelected(True)
                    self.conversation_list.setCurrentItem(item)
        if not shown and self.matches is not None:
            empty = QListWidgetItem("No conversation matches.")
            empty.setFlags(Qt.ItemFlag.NoItemFlags)
            self.conversation_list.addItem(empty)
        self._filling = False

    def item_of(self, conversation_id: str) -> QListWidgetItem | None:
        for row in range(self.conversation_list.count()):
            item = self.conversation_list.item(row)
            if item.data(ID_ROLE) == conversation_id:
                return item
        return None

    def ids(self) -> list[str]:
        """Conversation ids in the order shown."""
        out = []
        for row in range(self.conversation_list.count()):
            value = self.conversation_list.item(row).data(ID_ROLE)
            if value:
                out.append(str(value))
        return out

    def step(self, delta: int) -> str | None:
        """The conversation `delta` places from the current one (keyboard navigation)."""
        ids = self.ids()
        if not ids:
            return None
        at = ids.index(self.current) if self.current in ids else -1
        return ids[max(0, min(len(ids) - 1, at + delta))]

    def _chosen(self, item: QListWidgetItem) -> None:
        value = item.data(ID_ROLE)
        if value:
            self.conversation_chosen.emit(str(value))

    def _renamed(self, item: QListWidgetItem) -> None:
        value = item.data(ID_ROLE)
        if self._filling or not value:
            return
        conv = next((c for c in self.conversations if c.id == value), None)
        title = " ".join(item.text().split())
        if conv is not None and title and title != conv.title:
            self.rename_requested.emit(str(value), title)

    def begin_rename(self, conversation_id: str) -> None:
        item = self.item_of(conversation_id)
        if item is not None:
            self.conversation_list.editItem(item)

    def _menu(self, point: QPoint) -> None:
        item = self.conversation_list.itemAt(point)
        value = item.data(ID_ROLE) if item is not None else None
        if not value:
            return
        menu = QMenu(self)
        actions: list[tuple[str, Callable[[], None]]] = [
            ("Rename", lambda: self.begin_rename(str(value))),
            ("Export…", lambda: self.export_requested.emit(str(value))),
            ("Delete…", lambda: self.forget_requested.emit(str(value))),
        ]
        for text, slot in actions:
            menu.addAction(text).triggered.connect(slot)
        menu.popup(self.conversation_list.mapToGlobal(point))
        self.context_menu = menu  # kept for tests

    def _search_edited(self, text: str) -> None:
        self.search_changed.emit(text)

    # -- documents -----------------------------------------------------------------------
    def set_documents(self, documents: list[DocumentSummary]) -> None:
        self.documents = documents
        self.document_list.clear()
        for doc in documents:
            parts = f" · {doc.n_parts} parts" if doc.n_parts > 1 else ""
            item = QListWidgetItem(
                f"{doc.name}\n{doc.n_tokens:,} tokens{parts} · "
                f"{human_bytes(doc.block_bytes)} · {doc.status}"
            )
            item.setData(ID_ROLE, doc.id)
            self.document_list.addItem(item)

    def selected_document(self) -> str | None:
        items = self.document_list.selectedItems()
        if not items and self.document_list.count() == 1:
            items = [self.document_list.item(0)]
        return str(items[0].data(ID_ROLE)) if items else None

    def show_progress(self, visible: bool, label: str = "") -> None:
        for widget in (self.deposit_bar, self.deposit_label, self.deposit_cancel):
            widget.setVisible(visible)
        self.deposit_label.setText(label)
        if visible:
            self.deposit_bar.setValue(0)
