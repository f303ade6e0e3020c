"""Continued pretraining (report section 3): next-token + MTP losses and the train step."""
