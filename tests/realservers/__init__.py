"""Real inference servers for the tests: vLLM (CPU build), Triton (PyTriton) and llama.cpp's
llama-server, installed or built once per version into a cache, serving tiny models that the
tests generate. Loopback only; every load is bounded in count and time."""
