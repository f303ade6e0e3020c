"""The environment core: the coding episode (`env.py`) and environments as the agent loop drives them
(`agent_env.py`)."""
