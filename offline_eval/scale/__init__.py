"""Scale-out on Ray: judge replicas scoring blocks of rows (ray_run), and `compare --ray` (compare_ray).
"""
