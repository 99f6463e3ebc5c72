"""The launcher's code that runs in a rank process (internal).

``python -m dask_ddp._launch.rank.main`` (a function's rank), ``.script`` (a Python
script's), the warm template that forks ranks, the probe the rank installs, its GPU
placement, and live recovery's group (:mod:`.live`).
"""
