"""Interop with other BERT directory layouts: Google's TensorFlow releases (tf.py) and sentence-transformers
directories (sentence_transformers.py, the one owner of that format).

Design decision: interop builds on the model and never the other way round. The Hugging Face layout is
bertkit's own checkpoint format, so its key map lives in `bertkit.model.hf_names`; a converter here
maps a foreign layout to Hugging Face names and saves through the model classes."""
