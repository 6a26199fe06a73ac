"""Compute kernels the speed transforms install, torch only: oneDNN's int8 matrix multiply (int8.py) and
attention as two batched matrix multiplies (attention.py). Nothing here measures or decides; `bertkit.runtime`
times them and chooses."""
