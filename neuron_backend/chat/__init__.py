"""The chat wing: the Qwen3 engine, its reply stream, prompt text and KV-cache windows."""
