"""The native proxy runtimes (``libamdhip64.so``, ``libhiprtc.so``): where they are, how
they are built, and the tables generated for them. The libraries themselves are C
(hipr/proxy/native/); nothing here runs on a proxied program's call path."""
