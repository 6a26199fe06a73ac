"""Inference and serving: predictors (predictor.py, plain Python, no HTTP) and the HTTP server (app.py).

Design decision: importing `bertkit.serve` loads only the predictors; the web stack (FastAPI, uvicorn)
is imported by the HTTP modules alone (`bertkit.serve.app` and the route table's), so the Python API works
without the `serve` extra. Nothing
here imports `bertkit.train`.
"""

from bertkit.serve.predictor import (
    ClassificationPredictor,
    FillMaskPredictor,
    Predictor,
    QuestionAnsweringPredictor,
    TaggingPredictor,
    load_predictor,
)

__all__ = ["ClassificationPredictor", "FillMaskPredictor", "Predictor", "QuestionAnsweringPredictor",
           "TaggingPredictor", "load_predictor"]
