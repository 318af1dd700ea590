"""Child process for document extraction: `python -m galahad_desktop.memory.documents.extract_worker
PATH [picture|scan]` prints one JSON object, {"text": ...} (or {"pictures": [...]} for a
picture or a scanned PDF's pages) or {"error": ...}. It sets the memory and CPU
limits its parent asked for before reading, so a hostile PDF or DOCX can only fail this
process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from galahad_desktop.errors import InputError
from galahad_desktop.memory.documents import audio
from galahad_desktop.memory.documents.extraction import NoTextLayer, extract_text
from galahad_desktop.memory.documents.pictures import worker_output
from galahad_desktop.system.child import apply_own_limits


def run(path: str, mode: str = "text") -> int:
    apply_own_limits()
    out: dict[str, object]
    try:
        if mode == "text":
            out = {"text": extract_text(Path(path))}
        elif mode.startswith("audio"):
            out = audio.worker_output(Path(path), mode)
        else:
            out = worker_output(Path(path), mode)
    except NoTextLayer as exc:
        out = {"error": str(exc), "no_text": True}
    except InputError as exc:
        out = {"error": str(exc)}
    except MemoryError:
        out = {"error": f"'{Path(path).name}' needs more memory than a document may use."}
    except RecursionError:
        out = {"error": f"'{Path(path).name}' is nested too deeply to read."}
    except Exception as exc:  # a parser bug on hostile input: report it, never crash the app
        out = {"error": f"'{Path(path).name}' could not be read ({type(exc).__name__})."}
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], *sys.argv[2:3]))
