"""The wire format: a message's envelope and headers, commands and events, JSON bodies.

Nothing here knows SQL, a handler or Ray: ``messages`` (header names, ids, the rows the
transport moves), ``message_kinds`` (what a message type is declared to be) and
``serialization`` (msgspec bodies and NServiceBus's enclosed message type names).
"""
