"""Example endpoints: sales -> billing -> shipping."""
