"""The probe's files in a rank's work directory: what the rank writes and its supervisor
reads (internal).

The rank's probe (:mod:`dask_ddp._launch.rank.probe`) writes its collective state into a
small memory-mapped file (:data:`STATE_FILE`, laid out as :data:`LAYOUT`, its latest c10d
collective at :data:`C10D_AT`) and answers :data:`STACKS_SIGNAL` into :data:`STACKS_FILE`;
the supervisor's reader (:mod:`dask_ddp._launch.worker.probe`) reads both.
"""

from __future__ import annotations

import signal
import struct

#: The collectives of ``torch.distributed`` whose calls are tracked.
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
    "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "broadcast",
    "broadcast_object_list", "gather", "gather_object", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "recv",
    "batch_isend_irecv", "rendezvous",
)
#: States in the file: working (in the function, outside a collective), returned (the
#: function returned; the rank waits for its peers), then one per collective.
WORKING, RETURNED, FIRST_COLLECTIVE = 0, 1, 2
STATE_FILE = "probe.bin"
STACKS_FILE = "stacks.txt"
STACKS_SIGNAL = signal.SIGUSR2
LAYOUT = struct.Struct("<QdI4x")  # change counter, since (CLOCK_MONOTONIC), state
#: The rank's latest c10d collective: a counter (odd while being written), the length of
#: the JSON that follows, at this offset of the file.
C10D_AT = 64
C10D_HEAD = struct.Struct("<QI4x")
C10D_MAX = 4096
FILE_SIZE = C10D_AT + C10D_HEAD.size + C10D_MAX
