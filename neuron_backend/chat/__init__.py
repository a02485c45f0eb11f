"""The chat wing: the Qwen3 engine, its reply stream, prompt text, batch slots and KV-cache windows."""
