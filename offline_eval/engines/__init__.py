"""Judge engines behind one protocol (see base.py)."""

from .base import Engine, EngineError, JudgeOutput, JudgeRequest, Sampling

__all__ = ["Engine", "EngineError", "JudgeOutput", "JudgeRequest", "Sampling"]
