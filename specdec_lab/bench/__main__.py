"""``python -m specdec_lab.bench``: :func:`specdec_lab.bench.run.main` (also how a job's subprocess starts)."""

import sys

from specdec_lab.bench.run import main

sys.exit(main())
