"""An endpoint at module level, for the import-path test."""

from endpoint_runtime import Endpoint

endpoint = Endpoint("module-level")
