"""HTTP serving: OpenAI- and Anthropic-compatible endpoints over one engine, one generation at a time."""
from .app import add_serve_args, create_app, run_serve, sampling_defaults, serve

__all__ = ["create_app", "serve", "add_serve_args", "run_serve", "sampling_defaults"]
