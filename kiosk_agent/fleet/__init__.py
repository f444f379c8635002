"""The unit as the fleet sees it: heartbeats to HTTP and MQTT, Home Assistant discovery.

One module per concept: ``schema`` (the ``upstream:`` section), ``loopback`` (what counts as
this machine), ``report`` (the heartbeat body), ``queue`` (reports not yet sent), ``sink`` (what
every destination shares), ``http`` and ``mqtt`` (the destinations), ``topics`` (where a unit
publishes), ``entities`` and ``discovery`` (Home Assistant), ``component`` (the ``Upstream``
the agent runs).
"""
