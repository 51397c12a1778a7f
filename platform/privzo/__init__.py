"""privzo: private zeroth-order fine-tuning of language models."""

__version__ = "0.1.0"
