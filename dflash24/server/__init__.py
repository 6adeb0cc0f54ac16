"""HTTP serving: OpenAI- and Anthropic-compatible endpoints over one engine, one generation at a time."""
from .app import check_serve_args, create_app, run_serve, sampling_defaults, serve

__all__ = ["create_app", "serve", "run_serve", "check_serve_args", "sampling_defaults"]
