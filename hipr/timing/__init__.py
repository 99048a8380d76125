"""When each end of a call spins, naps or blocks: policies the client and the worker
share, with no I/O of their own.

- :mod:`hipr.timing.cpus`: how many CPUs this process may use, and the automatic spin
  window that follows from it (the sync client's wait, the worker's ``spin_wait``);
- :mod:`hipr.timing.wait_forecast`: how long a synchronize's wait is expected to take,
  from the last ones, so that a waiter sleeps through most of it and polls around its
  end (the sync client for its reply, the worker's loop for the kernel's end).
"""
