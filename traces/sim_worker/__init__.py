"""The simulated worker (``cache-router sim-worker``): the worker model as an OpenAI / vLLM /
SGLang server. ``server`` is the HTTP layer and the command, ``engine`` runs the model in real
time, ``api`` parses requests and builds bodies, ``pd`` plays one side of prefill/decode
disaggregation, ``responses`` holds the Responses API store and the other endpoints."""
