"""The launcher's code that runs in the Dask scheduler process: its plugins (internal).

The job guard (nothing of an ended job stays on the scheduler) and a live job's store.
"""
