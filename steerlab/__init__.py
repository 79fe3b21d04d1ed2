"""steerlab: a Jupyter-first toolkit for steering language models."""

__version__ = "0.1.0"
