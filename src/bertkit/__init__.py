"""bertkit: BERT (Devlin et al., 2018) end to end as real software.

The public API. Heavy modules (torch) are imported on first attribute access, so importing
`bertkit` (and running `bertkit --help`) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from bertkit.config import PRESETS, BertConfig, load_config, preset
from bertkit.errors import BertkitError

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "WordPieceTokenizer": "bertkit.tokenizer",
    "BertModel": "bertkit.model",
    "BertForPreTraining": "bertkit.model",
    "BertForMaskedLM": "bertkit.model",
    "BertForSequenceClassification": "bertkit.model",
    "BertForTokenClassification": "bertkit.model",
    "BertForQuestionAnswering": "bertkit.model",
    "BertForMultipleChoice": "bertkit.model",
}

__all__ = ["BertConfig", "BertkitError", "PRESETS", "load_config", "preset", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bertkit' has no attribute {name!r}")
