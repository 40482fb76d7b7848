"""Where connections come from: the PostgreSQL server (a DSN or the embedded one), pools of queue
connections, how many a deployment may open, and the circuit breakers that decide when an
outage becomes a critical error.
"""
