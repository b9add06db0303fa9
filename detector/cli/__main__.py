"""`python -m detector.cli`: the `splitbrain` command without its console script."""

import sys

from detector.cli.main import main

sys.exit(main())
