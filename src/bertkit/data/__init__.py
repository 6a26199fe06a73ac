"""Data: pre-training corpora -> instances -> shards -> `PretrainingDataset`, and fine-tuning readers.

Pre-training data is built by `build_pretraining_data(PretrainingDataSettings)` (the `bertkit data pretraining`
command) and read by `PretrainingDataset`, batched by `collate_pretraining` (or, for a GPU step that must not read the
device, `collate_static`). The fine-tuning readers live in their
own modules (`bertkit.data.glue`, `conll`, `squad`, `swag`) and are imported from there, so importing
this package does not pull them in.

Design decision: the pre-training pieces are pure, separately tested steps - `corpus` (reading and
bad-input rules), `instances` (Google's pair rules), `masking` (Google's masking rules), `shards`
(binary format, atomic writes), `pretraining` (the parallel streaming pipeline), `dataset` (the
reader) - see docs/data.md.
"""

from bertkit.data.dataset import PretrainingDataset, collate_pretraining, collate_static, collate_static_buckets
from bertkit.data.pretraining import InstanceSettings, PretrainingDataSettings, build_pretraining_data

__all__ = ["InstanceSettings", "PretrainingDataSettings", "PretrainingDataset", "build_pretraining_data",
           "collate_pretraining", "collate_static", "collate_static_buckets"]
