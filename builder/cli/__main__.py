"""``python -m builder.cli``: the envbuild command."""

import sys

from builder.cli.app import main

sys.exit(main())
