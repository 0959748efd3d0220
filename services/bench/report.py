"""What every bench report records about the machine it ran on."""

from __future__ import annotations

import os
import platform
from typing import Any


def machine() -> dict[str, Any]:
    """CPUs, platform, Python and the load average at the time of the report: timings on a
    shared machine mean little without them."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "load_avg": list(os.getloadavg())}
