"""The run core: rows in, judge stages scheduled over a bounded window of samples, results streamed out.

evaluation (evaluate, scan and score rows) -> scheduler (one run loop: waves or pipelined) -> state (feed,
stats, the engine's side), pipeline (the pipelined strategy), plan (the vocabulary metrics and the run
share), long_inputs and context_focus (fitting long contexts), results_io, summary, resume, progress.
"""
