"""python -m hybridkv plan|sim ...: the hybridkv command line."""

import sys

from . import main

sys.exit(main())
