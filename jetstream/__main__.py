"""``python -m jetstream``: the same as the ``jetstream`` command."""

import sys

from jetstream.cli import main

sys.exit(main())
