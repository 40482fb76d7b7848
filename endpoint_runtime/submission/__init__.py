"""The submit script's parts (``python -m endpoint_runtime.submit``, docs/cluster.md).

:mod:`.options` reads the command line and the ``[submit]`` table of ``--config``;
:mod:`.watch` keeps each deployment's last status without ever waiting long for a peeker;
:mod:`.report` says what each node did; :mod:`.driver` runs it all. The file
``endpoint_runtime/submit.py`` stays a small script (``ray submit`` copies that one file to
the head) that imports these from the installed package.
"""
