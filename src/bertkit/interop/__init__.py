"""Interop with other BERT checkpoint layouts: Google's TensorFlow releases (tf.py).

Design decision: interop builds on the model and never the other way round. The Hugging Face layout is
bertkit's own checkpoint format, so its key map lives in `bertkit.model.hf_names`; a converter here
maps a foreign layout to Hugging Face names and saves through the model classes."""
