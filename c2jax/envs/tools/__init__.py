"""The agent's tools: the tool-call text format (`protocol.py`) and the search tools (`code_search.py`,
`web_search.py`)."""
