"""ctxsum: LLM context summarization for Django."""

__version__ = "0.1.0"
