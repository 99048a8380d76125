"""A client's session on the worker, as the handlers act on it: the session (``state``),
its handle and allocation tables (``resources``), its quotas (``quotas``, ``limits``),
the thread its GPU calls run on (``gpu_thread``), the memory its graphs may write
(``graph_memory``), its reply cache for resent requests (``reply_cache``) and the loop's
busy polling (``busy_poll``); ``loop_wakeup`` wakes a task of the running loop.

Below both ``hipr.handlers`` and ``hipr.worker``: handlers read and change a session
through it, the worker opens, resumes and closes sessions. Import the module you need;
this package imports nothing itself.
"""
