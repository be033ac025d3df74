"""`python -m ctl.cli ARGS` is `ctl ARGS` (the tests run the command this way)."""

import sys

from ctl.cli import main

sys.exit(main())
