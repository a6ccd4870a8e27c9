"""The LLM scientist of ``--evolve``: Gemini (google-genai), OpenAI-compatible servers, replay.

Entry points: ``factory.make_llm_roles(config, task, log_dir)`` (the roles, or None offline),
``factory.llm_notice(config)``, ``llm_options.add_options`` / ``llm_options.validate``.
Failures are the typed errors of ``llm_errors.py``. Importing this package imports no LLM
client, HTTP library or torch.
"""
