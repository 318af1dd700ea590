"""The left side of the window: search, conversations (pinned first, then by date), each with
a one-line preview and the state of its memory (stored, resumed in N ms and verified, needs
re-reading); rename inline, pin, export and delete from a context menu; and the documents,
with their type, size and parts."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePath

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetrics,
    QIcon,
    QKeySequence,
    QPainter,
    QPaintEvent,
    QShortcut,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QProgressBar,
    QPushButton,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop.memory.results import ConversationSummary, DocumentSummary, SearchHit
from galahad_desktop.ui import theme
from galahad_desktop.ui.format import GROUPS, ago, date_group, human_bytes, memory_line
from galahad_desktop.ui.render import plain_text

ID_ROLE = Qt.ItemDataRole.UserRole
PREVIEW_ROLE = Qt.ItemDataRole.UserRole + 1
STATE_ROLE = Qt.ItemDataRole.UserRole + 2  # (text, palette colour name)
MATCH_ROLE = Qt.ItemDataRole.UserRole + 7  # the words a search found, drawn in the accent
HEADER_ROLE = Qt.ItemDataRole.UserRole + 3  # a date group's heading (not a conversation)
PINNED = "Pinned"
# Conversations programs made through the local server: listed apart, under the person's own.
API_GROUP = "Made by programs (local server)"
NO_CONVERSATIONS = "No conversations yet. New chat (Ctrl+N) starts one."


class PlaceholderList(QListWidget):
    """A list that says what belongs in it while it is empty (an empty state, not an item)."""

    def __init__(self, placeholder: str) -> None:
        super().__init__()
        self.placeholder = placeholder

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        if self.count():
            return
        painter = QPainter(self.viewport())
        painter.setPen(QColor(theme.current().muted))
        pad = theme.SPACE[3]
        painter.drawText(
            self.viewport().rect().adjusted(pad, pad, -pad, -pad),
            int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
            | int(Qt.TextFlag.TextWordWrap),
            self.placeholder,
        )
        painter.end()


class ConversationDelegate(QStyledItemDelegate):
    """A conversation as three lines: its title, a preview of its last message, and its memory
    state in colour. Group headers are drawn as small muted headings. Rename edits the title
    alone (the item's text)."""

    def _lines(self, option: QStyleOptionViewItem) -> tuple[QFont, QFont, int, int]:
        title = QFont(option.font)
        title.setBold(True)
        small = QFont(option.font)
        small.setPointSizeF(max(6.0, option.font.pointSizeF() * 0.9))
        return title, small, QFontMetrics(title).height(), QFontMetrics(small).height()

    def sizeHint(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:
        _title, _small, title_h, small_h = self._lines(option)
        pad = theme.SPACE[2]
        if index.data(HEADER_ROLE):
            return QSize(option.rect.width(), small_h + 2 * pad)
        return QSize(option.rect.width(), title_h + 2 * small_h + 2 * pad + 4)

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        palette = theme.current()
        title_font, small_font, title_h, small_h = self._lines(option)
        pad = theme.SPACE[2]
        painter.save()
        rect = option.rect.adjusted(2, 1, -2, -1)
        if index.data(HEADER_ROLE):
            painter.setFont(small_font)
            painter.setPen(QColor(palette.muted))
            painter.drawText(
                rect.adjusted(pad, 0, -pad, 0),
                Qt.AlignmentFlag.AlignBottom | Qt.AlignmentFlag.AlignLeft,
                str(index.data(Qt.ItemDataRole.DisplayRole) or "").upper(),
            )
            painter.restore()
            return
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        hovered = bool(option.state & QStyle.StateFlag.State_MouseOver)
        if selected or hovered:
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(palette.selection if selected else palette.border))
            painter.drawRoundedRect(rect, theme.RADIUS - 2, theme.RADIUS - 2)
        if option.state & QStyle.StateFlag.State_HasFocus:  # where the keyboard is
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setPen(QColor(palette.accent))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(rect, theme.RADIUS - 2, theme.RADIUS - 2)
        inner = rect.adjusted(pad, pad // 2 + 1, -pad, 0)
        width = inner.width()
        lines = (
            (title_font, palette.text, str(index.data(Qt.ItemDataRole.DisplayRole) or ""), title_h),
            (small_font, palette.muted, str(index.data(PREVIEW_ROLE) or ""), small_h),
        )
        y = inner.top()
        found = [str(w) for w in index.data(MATCH_ROLE) or []]
        for font, colour, text, height in lines:
            painter.setFont(font)
            elided = QFontMetrics(font).elidedText(text, Qt.TextElideMode.ElideRight, width)
            x = inner.left()
            for piece, matched in _runs(elided, found):  # a search's words stand out
                font.setBold(matched)
                painter.setFont(font)
                painter.setPen(QColor(palette.accent if matched else colour))
                painter.drawText(QRect(x, y, width, height), 0, piece)
                x += QFontMetrics(font).horizontalAdvance(piece)
            font.setBold(False)
            y += height
        state = index.data(STATE_ROLE)
        if state:
            text, colour_name = state
            painter.setFont(small_font)
            painter.setPen(QColor(getattr(palette, colour_name)))
            elided = QFontMetrics(small_font).elidedText(text, Qt.TextElideMode.ElideRight, width)
            painter.drawText(QRect(inner.left(), y + 2, width, small_h), 0, elided)
        painter.restore()


def _runs(text: str, words: list[str]) -> list[tuple[str, bool]]:
    """`text` cut into runs, each saying whether it is one of `words` (any case)."""
    if not words:
        return [(text, False)]
    pattern = re.compile("|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)), re.I)
    runs: list[tuple[str, bool]] = []
    at = 0
    for match in pattern.finditer(text):
        if match.start() > at:
            runs.append((text[at : match.start()], False))
        runs.append((match.group(0), True))
        at = match.end()
    if at < len(text):
        runs.append((text[at:], False))
    return runs


class Sidebar(QWidget):
    conversation_chosen = Signal(str)
    rename_requested = Signal(str, str)
    export_requested = Signal(str)
    forget_requested = Signal(str)
    pin_toggled = Signal(str)
    storage_action = Signal(str, str)  # item id, "keep" | "unkeep" | "give back"
    search_changed = Signal(str)
    picture_wanted = Signal(str)  # a picture document without its thumbnail yet

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QVBoxLayout(self)
        s = theme.SPACE
        layout.setContentsMargins(s[3], s[3], s[3], s[3])
        layout.setSpacing(s[2])
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search titles and messages (Ctrl+K)")
        self.search.setClearButtonEnabled(True)
        self.search.setAccessibleName("Search conversations")
        self.search.setToolTip("Search titles and message text (Ctrl+K)")
        self.search.textChanged.connect(self._search_edited)
        # From the search box by keyboard: Enter opens the first conversation shown, Down
        # goes into the list (they did nothing).
        self.search.returnPressed.connect(self._open_first)
        QShortcut(QKeySequence(Qt.Key.Key_Down), self.search, self._into_list).setContext(
            Qt.ShortcutContext.WidgetShortcut
        )
        self.new_button = QPushButton(theme.icon("new"), "New chat")
        self.new_button.setAccessibleName("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        theme.set_primary(self.new_button)
        self._build_lists()
        conversations_heading = QLabel("Conversations")
        documents_heading = QLabel("Documents")
        for heading in (conversations_heading, documents_heading):
            theme.set_role(heading, "heading")
        conversations_heading.setBuddy(self.conversation_list)
        documents_heading.setBuddy(self.document_list)
        # The two lists share the height through a splitter a person can drag: the
        # documents had a quarter of it (a three-row box) whatever the library held.
        documents_pane = QWidget()
        documents_layout = QVBoxLayout(documents_pane)
        documents_layout.setContentsMargins(0, theme.SPACE[2], 0, 0)
        documents_layout.addWidget(documents_heading)
        documents_layout.addWidget(self.document_list, 1)
        self.lists = QSplitter(Qt.Orientation.Vertical)
        self.lists.setChildrenCollapsible(False)
        self.lists.addWidget(self.conversation_list)
        self.lists.addWidget(documents_pane)
        self.lists.setStretchFactor(0, 3)
        self.lists.setStretchFactor(1, 2)
        for widget in (
            self.search,
            self.new_button,
            conversations_heading,
            self.lists,
            self.add_document_button,
            self.chat_document_button,
            self.play_document_button,
            self.deposit_bar,
            self.deposit_label,
            self.deposit_cancel,
        ):
            layout.addWidget(widget)
        layout.setStretchFactor(self.lists, 1)
        self.conversations: list[ConversationSummary] = []
        self.documents: list[DocumentSummary] = []
        self.picture_icons: dict[str, QIcon] = {}  # picture documents' thumbnails (memory only)
        self.matches: set[str] | None = None  # conversation ids a search found
        self.snippets: dict[str, str] = {}  # where it found the words, by conversation
        self.found_words: list[str] = []
        self.current: str | None = None
        self.pinned: set[str] = set()
        self.kept: set[str] = set()  # conversations whose memory is never given back
        self.restores: dict[str, str] = {}  # conversation id -> how its last resume went
        self._filling = False

    def _build_lists(self) -> None:
        """The conversation and document lists, and the document buttons under them."""
        self.conversation_list = PlaceholderList("Loading conversations…")  # until the list comes
        self.conversation_list.setAccessibleName("Conversations")
        self.conversation_list.setToolTip(
            "Your conversations: Enter opens, F2 renames, the context menu pins, exports or "
            "deletes (Alt+Up / Alt+Down step through them)"
        )
        self.conversation_list.setItemDelegate(ConversationDelegate(self.conversation_list))
        self.conversation_list.setMouseTracking(True)
        self.conversation_list.setWordWrap(True)
        self.conversation_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conversation_list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.conversation_list.customContextMenuRequested.connect(self._menu)
        self.conversation_list.itemActivated.connect(self._chosen)
        self.conversation_list.itemClicked.connect(self._chosen)
        self.conversation_list.itemChanged.connect(self._renamed)
        self.document_list = PlaceholderList(
            "No documents yet. Drop files on the window, or Add document… (Ctrl+O): each is "
            "read once and kept."
        )
        self.document_list.setWordWrap(True)
        # Several chosen (Ctrl/Shift-click) go into one new chat, the others stacked.
        self.document_list.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.document_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.document_list.setIconSize(QSize(28, 28))
        self.document_list.setAccessibleName("Documents")
        self.document_list.setToolTip(
            "Documents read once and kept: select one to chat with it or delete it"
        )
        self.add_document_button = QPushButton(theme.icon("add-document"), "Add document…")
        self.add_document_button.setToolTip(
            "Read a document once and keep it (.txt, .md, .pdf, .docx, source files; Ctrl+O)"
        )
        self.chat_document_button = QPushButton(theme.icon("document"), "Chat with this document")
        self.chat_document_button.setToolTip("Start a conversation on the selected document")
        self.play_document_button = QPushButton("▶ Play memo")
        self.play_document_button.setToolTip(
            "Play the selected voice memo (from memory: it is never written out)"
        )
        self.play_document_button.setAccessibleName("Play memo")
        self.play_document_button.setVisible(False)
        self.document_list.itemSelectionChanged.connect(self._document_selected)
        self.deposit_bar = QProgressBar()
        self.deposit_bar.setAccessibleName("Reading progress")
        self.deposit_label = QLabel()
        self.deposit_label.setWordWrap(True)
        self.deposit_cancel = QPushButton(theme.icon("cancel"), "Cancel")
        self.deposit_cancel.setToolTip("Stop reading; nothing half-read is kept")
        for button in (self.add_document_button, self.chat_document_button, self.deposit_cancel):
            button.setAccessibleName(button.text().rstrip("…"))
        for hidden in (self.deposit_bar, self.deposit_label, self.deposit_cancel):
            hidden.setVisible(False)

    # -- conversations -------------------------------------------------------------------
    def set_conversations(self, conversations: list[ConversationSummary]) -> None:
        self.conversations = conversations
        self.kept = {c.id for c in conversations if c.kept}
        self.fill()

    def set_matches(self, ids: set[str] | None) -> None:
        self.matches = ids
        self.snippets, self.found_words = {}, []
        self.fill()

    def show_hits(self, hits: list[SearchHit], query: str) -> None:
        """A search's conversations, each previewed where the words were found, the words
        drawn in the accent (a search showed only which conversations matched)."""
        self.matches = {h.conversation_id for h in hits}
        self.snippets = {h.conversation_id: h.snippet for h in hits}
        self.found_words = query.split()
        self.fill()

    def fill(self) -> None:
        """The list, grouped by date (Today, Yesterday, …); headers are not selectable."""
        self._filling = True
        self.conversation_list.clear()
        shown = [c for c in self.conversations if self.matches is None or c.id in self.matches]
        groups = (PINNED, *GROUPS, API_GROUP)
        by_group: dict[str, list[ConversationSummary]] = {g: [] for g in groups}
        for conv in shown:
            if conv.id in self.pinned:
                group = PINNED
            else:
                group = API_GROUP if conv.origin == "api" else date_group(conv.updated_at)
            by_group[group].append(conv)
        for group in groups:
            if not by_group[group]:
                continue
            header = QListWidgetItem(group)
            header.setFlags(Qt.ItemFlag.NoItemFlags)
            header.setData(HEADER_ROLE, True)
            self.conversation_list.addItem(header)
            for conv in by_group[group]:
                item = QListWidgetItem(conv.title or "New conversation")
                state = memory_line(conv, self.restores.get(conv.id, ""))
                item.setToolTip(
                    f"{ago(conv.updated_at)} · {conv.n_tokens:,} tokens · "
                    f"{conv.n_messages} messages · {state[0]} · "
                    + ("kept on disk · " if conv.kept else "")
                    + ("made through the local API server · " if conv.origin == "api" else "")
                    + "F2 or double-click to rename"
                )
                item.setData(ID_ROLE, conv.id)
                preview = self.snippets.get(conv.id) or plain_text(conv.preview)
                item.setData(PREVIEW_ROLE, preview or "No messages yet")
                item.setData(MATCH_ROLE, self.found_words)
                item.setData(STATE_ROLE, state)
                item.setFlags(
                    Qt.ItemFlag.ItemIsSelectable
                    | Qt.ItemFlag.ItemIsEnabled
                    | Qt.ItemFlag.ItemIsEditable
                )
                self.conversation_list.addItem(item)
                if conv.id == self.current:
                    item.setSelected(True)
                    self.conversation_list.setCurrentItem(item)
        self.conversation_list.placeholder = (
            "No conversation matches." if self.matches is not None else NO_CONVERSATIONS
        )
        self.conversation_list.viewport().update()
        self._filling = False

    def item_of(self, conversation_id: str) -> QListWidgetItem | None:
        for row in range(self.conversation_list.count()):
            item = self.conversation_list.item(row)
            if item.data(ID_ROLE) == conversation_id:
                return item
        return None

    def mark_current(self, conversation_id: str | None) -> None:
        """Highlight the conversation on screen (None: a new chat, no row); choosing a row
        is the user's, so this opens nothing."""
        self.current = conversation_id
        item = self.item_of(conversation_id) if conversation_id else None
        self.conversation_list.clearSelection()
        if item is None:
            self.conversation_list.setCurrentRow(-1)  # no row is current either
        else:
            self.conversation_list.setCurrentItem(item)
            item.setSelected(True)

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

    def _rows_with_ids(self) -> list[int]:
        list_ = self.conversation_list
        return [r for r in range(list_.count()) if list_.item(r).data(ID_ROLE)]

    def _open_first(self) -> None:
        rows = self._rows_with_ids()
        if rows:
            self._chosen(self.conversation_list.item(rows[0]))

    def _into_list(self) -> None:
        rows = self._rows_with_ids()
        if rows:
            self.conversation_list.setCurrentRow(rows[0])
            self.conversation_list.setFocus()

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
            (
                "Unpin" if value in self.pinned else "Pin to the top",
                lambda: self.pin_toggled.emit(str(value)),
            ),
            ("Rename", lambda: self.begin_rename(str(value))),
            (
                "Let its memory be given back" if value in self.kept else "Keep its memory on disk",
                lambda: self.storage_action.emit(
                    str(value), "unkeep" if value in self.kept else "keep"
                ),
            ),
            (
                "Give back its disk space",
                lambda: self.storage_action.emit(str(value), "give back"),
            ),
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
            unit = "pages" if doc.kind == "scan" else "parts"
            parts = f" · {doc.n_parts} {unit}" if doc.n_parts > 1 else ""
            parts += " · picture" if doc.kind == "picture" else ""
            parts += " · voice memo" if doc.kind == "memo" else ""
            item = QListWidgetItem(
                f"{doc.name}\n{doc.n_tokens:,} tokens{parts} · "
                f"{human_bytes(doc.block_bytes)} · {doc.status}"
            )
            thumbnail = self.picture_icons.get(doc.id)
            item.setIcon(
                thumbnail
                if thumbnail is not None
                else theme.type_badge(PurePath(doc.name).suffix.lstrip(".") or "txt")
            )
            if doc.kind in ("picture", "scan") and thumbnail is None:
                self.picture_wanted.emit(doc.id)
            item.setToolTip(
                f"{doc.name}: read once, {doc.n_tokens:,} tokens kept in {doc.n_parts} "
                f"part(s), {human_bytes(doc.block_bytes)} on disk ({doc.status})"
            )
            item.setData(ID_ROLE, doc.id)
            self.document_list.addItem(item)

    def set_picture_icon(self, document_id: str, icon: QIcon) -> None:
        self.picture_icons[document_id] = icon
        for row in range(self.document_list.count()):
            item = self.document_list.item(row)
            if item.data(ID_ROLE) == document_id:
                item.setIcon(icon)

    def _document_selected(self) -> None:
        """Play shows for a selected voice memo only; the chat button says how many."""
        chosen = self.selected_documents()
        doc = next((d for d in self.documents if d.id == chosen[0]), None) if chosen else None
        self.play_document_button.setVisible(
            len(chosen) == 1 and doc is not None and doc.kind == "memo"
        )
        several = len(chosen) > 1
        self.chat_document_button.setText(
            f"Chat with these {len(chosen)} documents" if several else "Chat with this document"
        )
        self.chat_document_button.setToolTip(
            "A new chat on the first, the others stacked after it: none is read again"
            if several
            else "Start a conversation on the selected document"
        )

    def selected_documents(self) -> list[str]:
        """The selected documents' ids, in the list's order (the only one when alone)."""
        items = sorted(self.document_list.selectedItems(), key=self.document_list.row)
        if not items and self.document_list.count() == 1:
            items = [self.document_list.item(0)]
        return [str(item.data(ID_ROLE)) for item in items if item.data(ID_ROLE)]

    def selected_document(self) -> str | None:
        items = self.document_list.selectedItems()
        if not items and self.document_list.count() == 1:
            items = [self.document_list.item(0)]
        value = items[0].data(ID_ROLE) if items else None
        return str(value) if value else None

    def show_progress(self, visible: bool, label: str = "") -> None:
        for widget in (self.deposit_bar, self.deposit_label, self.deposit_cancel):
            widget.setVisible(visible)
        self.deposit_label.setText(label)
        if visible:
            self.deposit_bar.setValue(0)
