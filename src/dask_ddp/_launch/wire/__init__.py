"""What crosses between the launcher's processes (internal).

The typed records, names, store keys and options that the client, the scheduler, the
workers and the ranks share; it imports none of their rooms.
"""
