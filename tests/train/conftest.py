"""Makes tests/train/toy_training.py (the toy task shared by the loop tests and the DDP worker script)
importable under pytest's importlib import mode."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
