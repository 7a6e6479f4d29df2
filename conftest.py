"""Shared pytest configuration: a real Jupyter server per test through pytest-jupyter."""

pytest_plugins = ("pytest_jupyter.jupyter_server",)
