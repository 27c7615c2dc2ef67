"""Ragas 0.4 import path: `from offline_eval.metrics.collections import Faithfulness, ...`."""

from .answer_accuracy import AnswerAccuracy
from .answer_correctness import AnswerCorrectness
from .answer_relevancy import AnswerRelevancy
from .context_precision import ContextPrecision
from .context_recall import ContextRecall
from .context_relevance import ContextRelevance
from .faithfulness import Faithfulness
from .response_groundedness import ResponseGroundedness
from .rubrics import RubricsScore

ALL = (AnswerAccuracy, ContextRelevance, ResponseGroundedness, Faithfulness, AnswerRelevancy,
       ContextPrecision, ContextRecall, AnswerCorrectness, RubricsScore)

__all__ = [cls.__name__ for cls in ALL]
