"""Entry point of the frozen app: no arguments opens the window; `--self-test` and every
`galahad` command work as in a checkout."""

import sys

from galahad_desktop.cli import main

if __name__ == "__main__":
    sys.exit(main())
