"""The launcher's code that runs in a Dask worker process (internal).

The supervisor task of a rank and what it needs: the rank's process (cold or warm
start), its environment, work directory, probe reader, activity, outcome, and a live
job's loss and leave. It reaches the rank process through files, sockets and ``-m``
module names (:mod:`..wire`), never by importing rank code.
"""
