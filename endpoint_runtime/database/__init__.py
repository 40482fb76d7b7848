"""The database set-up of an endpoint: the tables it uses and their installers, its business
tables, and the least privileges a role needs to run it."""
