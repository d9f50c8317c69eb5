"""Serving: the inference servers that policies talk to, and how they receive new weights.

* ``areal_agents.serving.server.BuiltinServer`` / ``python -m areal_agents.serving.serve`` —
  the built-in transformers server (``api``: its HTTP routes, ``engine``: continuous batching).
* ``areal_agents.serving.vllm.VLLMServer`` — stock vLLM's OpenAI server, launched and updated.
* ``areal_agents.serving.process`` — the child-process lifecycle both launchers share.
* ``areal_agents.serving.model.default_model_path()`` — the offline default model.
* ``areal_agents.serving.staging`` — weights staged as one safetensors file in shared memory
  (written in place, read as views), for ``inference.weight_sync=object_store``.

Nothing is imported here, so that ``import areal_agents.serving`` stays cheap (the engine needs
torch, the API fastapi).
"""
