"""The scale-out load benchmark: this runtime beside its peers and the database's own limit."""
