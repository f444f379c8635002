"""The unit as the fleet sees it: heartbeats to HTTP and MQTT, Home Assistant discovery.

One module per concept: ``schema`` (the ``upstream:`` section), ``loopback`` (what counts as
this machine), ``report`` (the heartbeat body), ``queue`` (reports not yet sent), ``sink`` (what
every destination shares), ``http`` and ``mqtt`` (the destinations), ``backoff`` (waits a
fleet takes without moving as a herd), ``topics`` (where a unit publishes), ``entities`` and
``discovery`` (Home Assistant), ``inventory`` (the fleet as the broker holds it: ``fleet
list``), ``component`` (the ``Upstream`` the agent runs).
"""
