"""Models: loading causal and masked LMs, built-in tiny models, and trainable views."""
