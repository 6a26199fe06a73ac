"""Interop with other BERT checkpoint layouts: Hugging Face (hf.py) and Google TensorFlow (tf.py)."""
