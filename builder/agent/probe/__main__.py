"""``python3 -m probe``: print this machine's ``envbuild.probe/1`` document (exit 0)."""

import sys

from .collect import main

sys.exit(main())
