"""The export tests' checkpoint directories: the serving tests' tiny seeded models (tests/serve/conftest.py),
so an exported graph is compared with what the server answers for the same directory."""

from __future__ import annotations

from ..serve.conftest import (  # noqa: F401 - fixtures are found by their name in this module
    TAGS,
    VOCAB,
    bert_dir,
    build,
    build_feature_based,
    classifier_dir,
    mlm_dir,
    sentence_dir,
    tagger_dir,
    tokenizer,
)
