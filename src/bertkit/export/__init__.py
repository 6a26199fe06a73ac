"""`bertkit export onnx`: the ONNX graph of any bertkit head checked against PyTorch (onnx.py), ONNX Runtime's
fused BERT graph (fusion.py) and the files that make the output directory deploy on its own (directory.py)."""
