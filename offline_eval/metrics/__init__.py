"""Metrics. Classes as in `ragas.metrics.collections`; lowercase ready-made instances as in Ragas' legacy
`from ragas.metrics import faithfulness, answer_relevancy` (they use the default judge and embeddings)."""

from .base import Metric, MetricResult
from .collections import (ALL, AnswerAccuracy, AnswerCorrectness, AnswerRelevancy, ContextPrecision,
                          ContextRecall, ContextRelevance, Faithfulness, ResponseGroundedness, RubricsScore)

answer_accuracy = AnswerAccuracy()
context_relevance = ContextRelevance()
response_groundedness = ResponseGroundedness()
faithfulness = Faithfulness()
answer_relevancy = AnswerRelevancy()
answer_relevance = answer_relevancy  # the spelling some tutorials use
context_precision = ContextPrecision()
context_recall = ContextRecall()
answer_correctness = AnswerCorrectness()
rubrics_score = RubricsScore()

# Other spellings users type, mapped to metric names.
METRIC_ALIASES = {"answer_relevance": "answer_relevancy", "rubric_score": "rubrics_score",
                  "groundedness": "response_groundedness", "nv_accuracy": "answer_accuracy"}


def judge_constraints(metrics=None) -> list:
    """The distinct output constraints `metrics` (default: every metric with its default settings) ask the
    judge for, in a stable order: what a vLLM server should compile before a run (engines/vllm_launch.py)."""
    seen: dict[str, object] = {}
    for m in metrics if metrics is not None else [cls() for cls in ALL]:
        for c in m.constraints:
            seen.setdefault(c.key, c)
    return list(seen.values())


def metric_by_name(name: str) -> Metric:
    """A fresh metric instance by its name (as in results and the CLI's --metrics)."""
    key = METRIC_ALIASES.get(name.strip().lower(), name.strip().lower())
    for cls in ALL:
        if cls.name == key:
            return cls()
    known = ", ".join(cls.name for cls in ALL)
    raise ValueError(f"unknown metric {name!r}; available: {known}")


__all__ = ["Metric", "MetricResult", "metric_by_name", "judge_constraints", *[cls.__name__ for cls in ALL],
           "answer_accuracy", "context_relevance", "response_groundedness", "faithfulness",
           "answer_relevancy", "answer_relevance", "context_precision", "context_recall",
           "answer_correctness", "rubrics_score"]
