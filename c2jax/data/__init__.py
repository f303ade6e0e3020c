"""Data: tokenizers, corpora and packing for pretraining (report section 3)."""
