"""``python -m services.cli``: the ``offramp`` command (child services are started this way)."""

import sys

from services.cli.main import main

sys.exit(main())
