"""``python -m endpoint_runtime.cli``: the same as the ``endpoint-runtime`` console script."""

from __future__ import annotations

import sys

from endpoint_runtime.cli import main

sys.exit(main())
