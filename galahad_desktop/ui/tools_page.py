"""Settings → Tools: the MCP servers the window's chats may use. Add one by a command line
(a program on this computer, spoken to over stdio) or a URL (streamable HTTP), see the tools
it offers, remove it. Which tools run without asking is shown (and reset by removing the
server). The list is kept in the catalog, encrypted: a command or URL can hold a token."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from galahad_desktop.memory.results import Tool, ToolServerInfo
from galahad_desktop.ui import theme
from galahad_desktop.ui.host import Host
from galahad_desktop.ui.wheel import guard_wheel

ABOUT = (
    "Chats can call tools from MCP servers: a program on this computer (its command line, "
    "for example <code>npx -y @modelcontextprotocol/server-filesystem ~/Documents</code>) or "
    "a server's URL. Choose the servers a new chat offers with its <b>Tools</b> button; every "
    "call is shown and asked before it runs. Gemma 4 calls tools; Gemma 3 does not. What is "
    "changed here is kept at once."
)


class ToolsPage(QWidget):
    def __init__(self, host: Host) -> None:
        super().__init__()
        self.host = host
        self.servers: list[ToolServerInfo] = []
        layout = QVBoxLayout(self)
        about = QLabel(ABOUT)
        about.setWordWrap(True)
        theme.set_role(about, "muted")
        layout.addWidget(about)
        self.listing = QListWidget()
        self.listing.setAccessibleName("Tool servers")
        self.listing.currentRowChanged.connect(lambda _row: self._selected())
        layout.addWidget(self.listing, 1)
        row = QHBoxLayout()
        self.show_button = QPushButton("Show its tools")
        self.show_button.setAccessibleName("Show the server's tools")
        self.show_button.clicked.connect(self.show_tools)
        self.remove_button = QPushButton("Remove")
        self.remove_button.setAccessibleName("Remove the server")
        self.remove_button.clicked.connect(self.remove)
        row.addWidget(self.show_button)
        row.addWidget(self.remove_button)
        row.addStretch(1)
        layout.addLayout(row)
        self.tools = QPlainTextEdit()
        self.tools.setReadOnly(True)
        self.tools.setAccessibleName("The server's tools")
        self.tools.setMaximumHeight(120)
        layout.addWidget(self.tools)
        form = QFormLayout()
        self.name = QLineEdit()
        self.name.setAccessibleName("Server name")
        self.name.setPlaceholderText("files")
        self.target = QLineEdit()
        self.target.setAccessibleName("Command or URL")
        self.target.setPlaceholderText("a command line, or http://127.0.0.1:8000/mcp")
        self.header = QLineEdit()
        self.header.setAccessibleName("HTTP header")
        self.header.setPlaceholderText("a URL server's header, e.g. Authorization: Bearer …")
        self.header.setToolTip("Sent with every request to a URL server; kept encrypted")
        self.header.setEchoMode(QLineEdit.EchoMode.Password)  # a token, often
        self.timeout = QDoubleSpinBox()
        guard_wheel(self.timeout)
        self.timeout.setAccessibleName("Time limit of a call")
        self.timeout.setRange(1, 3600)
        self.timeout.setDecimals(0)
        self.timeout.setValue(60)
        self.timeout.setSuffix(" s")
        self.check_start = QCheckBox("Check that it starts")
        self.check_start.setChecked(True)
        self.check_start.setToolTip(
            "Start the server (or reach its URL) and ask for its tools before adding it"
        )
        self.add_button = QPushButton("Add server")
        self.add_button.setAccessibleName("Add server")
        self.add_button.clicked.connect(self.add)
        form.addRow("Name", self.name)
        form.addRow("Command or URL", self.target)
        form.addRow("Header (optional)", self.header)
        form.addRow("Time limit of a call", self.timeout)
        form.addRow("", self.check_start)
        form.addRow("", self.add_button)
        layout.addLayout(form)
        self.problem = QLabel()
        self.problem.setWordWrap(True)
        self.problem.setAccessibleName("Problem")
        theme.set_role(self.problem, "error")
        layout.addWidget(self.problem)
        self.reload()

    def reload(self) -> None:
        self.host.bridge.run(
            lambda core, _job: core.tool_servers(), on_done=self._listed, on_error=self._failed
        )

    def _listed(self, servers: list[ToolServerInfo]) -> None:
        self.servers = servers
        self.listing.clear()
        for server in servers:
            always = f" · runs without asking: {', '.join(server.always)}" if server.always else ""
            self.listing.addItem(f"{server.name} — {server.target}{always}")
        if not servers:
            self.listing.addItem("No tool servers yet.")
        self._selected()

    def _selected(self) -> ToolServerInfo | None:
        row = self.listing.currentRow()
        chosen = self.servers[row] if 0 <= row < len(self.servers) else None
        self.show_button.setEnabled(chosen is not None)
        self.remove_button.setEnabled(chosen is not None)
        return chosen

    def _failed(self, message: str, _kind: str = "") -> None:
        self.problem.setText(message)

    def add(self) -> None:
        name, target, timeout = self.name.text(), self.target.text(), self.timeout.value()
        check = self.check_start.isChecked()
        headers = [self.header.text()] if self.header.text().strip() else []
        self.problem.clear()

        def added(server: ToolServerInfo) -> None:
            self.name.clear()
            self.target.clear()
            self.header.clear()
            offers = f"; it offers {len(server.checked)} tool(s)" if check else ""
            self.host.set_status(f"Added the tool server '{server.name}'{offers}.")
            self.reload()

        self.host.bridge.run(
            lambda core, job: core.add_tool_server(name, target, timeout, headers, check, job),
            on_done=added,
            on_error=self._failed,
            label=f"Starting {name} to check it" if check else "Adding a tool server",
        )

    def remove(self) -> None:
        chosen = self._selected()
        if chosen is None:
            return
        self.host.bridge.run(
            lambda core, _job: core.remove_tool_server(chosen.name),
            on_done=lambda _none: self.reload(),
            on_error=self._failed,
        )

    def show_tools(self) -> None:
        chosen = self._selected()
        if chosen is None:
            return
        self.problem.clear()
        self.tools.setPlainText(f"Asking {chosen.name} for its tools…")

        def shown(tools: list[Tool]) -> None:
            lines = [f"{t.name} — {t.description}" for t in tools]
            self.tools.setPlainText("\n".join(lines) or f"{chosen.name} offers no tools.")

        def failed(message: str, _kind: str) -> None:
            self.tools.clear()
            self.problem.setText(message)

        self.host.bridge.run(
            lambda core, job: core.server_tools(chosen.name, job),
            on_done=shown,
            on_error=failed,
            label=f"Asking {chosen.name} for its tools",
        )
