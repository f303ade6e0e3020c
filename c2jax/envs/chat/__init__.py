"""Chat formats: how turns and tool calls are written (`chat_format.py`, `tool_formats.py`), tokenized
(`chat_tokens.py`), and the self-summary texts (`self_summary.py`)."""
