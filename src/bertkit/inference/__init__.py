"""What every command that runs a model over many inputs shares: length-sorted batches with padding
(batching.py) and sentence vectors from token vectors (pooling.py).

Design decision: this package sits between the model and its users and imports neither side of them
(no tasks, serve, data or training code; the layering test enforces it), so fine-tuning evaluation,
`predict`/`evaluate`, the predictors and server, `extract` and `export` all call the one batching loop
and the one padding rule instead of keeping their own. Import the module you need.
"""
