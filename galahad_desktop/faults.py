"""Fault injection for crash tests: die at a named point, like a power cut.

Set GALAHAD_CRASHPOINT=<name> and the process SIGKILLs itself when it reaches that point.
Unset (always, outside tests) this is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal


def crashpoint(name: str) -> None:
    if os.environ.get("GALAHAD_CRASHPOINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
