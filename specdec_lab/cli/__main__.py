"""``python -m specdec_lab.cli``: the ``specdec-lab`` command."""

import sys

from specdec_lab.cli import main

sys.exit(main())
