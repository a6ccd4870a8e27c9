"""The offline scientist: knob moves, compositions and grafts, with no LLM."""
