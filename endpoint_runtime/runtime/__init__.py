"""The runtime: an endpoint's definition (``endpoint``), its deployment on Ray (``deployment``
and the actors in ``actors/``), and sending from outside handlers (``sender``)."""
