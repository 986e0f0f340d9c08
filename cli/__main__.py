"""`python -m ringserve.cli`: the `ringserve` command."""

import sys

from ringserve.cli import main

sys.exit(main())
