"""Where and how a run computes, decided on the machine that runs it: the device, precision and seeds
(device.py), the dense-layer and attention probe (probe.py), `--precision auto` checked on the model's own step
(step_probe.py), glibc's allocator thresholds (allocator.py) and what `bertkit doctor` prints (report.py).

Importing the package imports nothing: allocator.py is torch-free and used by the command line before torch."""
