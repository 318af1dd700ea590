import sys

from galahad_desktop.cli import main

sys.exit(main())
