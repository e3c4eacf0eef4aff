"""`python -m cli`: the `trainyard` command, as the console script runs it."""

import sys

from cli.main import main

sys.exit(main())
