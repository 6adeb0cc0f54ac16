"""HTTP serving: OpenAI- and Anthropic-compatible endpoints over one engine, one generation at a time."""
from .app import create_app, run_serve, sampling_defaults, serve

__all__ = ["create_app", "serve", "run_serve", "sampling_defaults"]
