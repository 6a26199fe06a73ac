"""`python -m gpu_check` (with src/ and scripts/ on PYTHONPATH; scripts/gpu_check.sh sets them)."""

import sys

from gpu_check.run import main

sys.exit(main())
