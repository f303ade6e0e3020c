"""Tasks as the actors see them: the token task protocol and its registry (`suite.py`), and the built-in
character-class suite (`char_class.py`)."""
