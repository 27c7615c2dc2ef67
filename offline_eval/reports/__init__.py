"""What a run leaves for people and CI: the HTML comparison report and the CI gate.
"""
