"""offline-eval: RAG evaluation with Ragas' semantics, judged by constrained models on your own hardware.

    from offline_eval import evaluate
    from offline_eval.metrics import faithfulness, answer_relevancy
    results = evaluate(dataset, metrics=[faithfulness, answer_relevancy])
    results["faithfulness"]
"""

from .dataset import DataError, EvaluationDataset, SingleTurnSample, ValidationError
from .run.evaluation import EvaluationResult, evaluate, evaluate_iter
from .judges import Embeddings, embedding_factory, llm_factory
from .metrics import MetricResult

__version__ = "0.2.1"

__all__ = ["evaluate", "evaluate_iter", "EvaluationResult", "EvaluationDataset", "SingleTurnSample",
           "MetricResult", "llm_factory", "embedding_factory", "Embeddings", "DataError", "ValidationError"]
