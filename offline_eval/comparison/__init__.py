"""Judges against human labels: labels (label files), compare (run judges, report agreement),
agreement and calibration (the statistics), tables and reuse (reports and earlier runs).
"""
