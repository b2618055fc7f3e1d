"""Checkpoint tests. Everything here is local: set before any test module imports transformers
(Hugging Face's hub library reads these at import time)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
