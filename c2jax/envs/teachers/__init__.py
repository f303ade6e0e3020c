"""Teachers: scripted policies (`scripted_policies.py`), SFT demonstrations (`demonstrations.py`) and a suite's own
BPE trained on their text (`suite_tokenizer.py`)."""
