"""Model architecture presets; each module defines `get_model_config()` -> ModelConfig."""
