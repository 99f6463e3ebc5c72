"""The launcher's code that runs in the user's client process (internal).

The job's handle, its watcher, placement, stall detection, the recovery machinery and the
live job's watch. It reaches the other processes only through :mod:`..wire`: the workers'
tasks and the cluster's plugins are named by path there, never imported here.
"""
