"""The worker and client version (not the wire protocol's: see hipr.protocol.header)."""

__version__ = "0.1.0"
