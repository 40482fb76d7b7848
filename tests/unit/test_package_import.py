"""What importing the package costs: Ray only when a deployment is asked for."""

from __future__ import annotations

import subprocess
import sys


def _ray_imported_after(script: str) -> str:
    result = subprocess.run([sys.executable, "-c", f"import sys; {script}; "
                             "print('ray' in sys.modules)"],
                            capture_output=True, text=True, check=True)
    return result.stdout.strip()


def test_the_package_and_the_live_report_source_import_without_ray() -> None:
    # The live report's source is imported by Spark's Python process on every start: Ray
    # would add about half a second there, and to every command that needs no Ray.
    assert _ray_imported_after("from endpoint_runtime import Endpoint, Sender, "
                          "TransportSettings") == "False"
    assert _ray_imported_after("import endpoint_runtime.analytics.stream_source") == "False"


def test_a_deployment_asked_for_brings_ray_and_every_public_name_resolves() -> None:
    assert _ray_imported_after("from endpoint_runtime import EndpointDeployment") == "True"
    script = ("import endpoint_runtime as er; "
              "missing = [n for n in er.__all__ if not hasattr(er, n)]; "
              "assert not missing, missing; from endpoint_runtime import *")
    assert _ray_imported_after(script) == "True"
