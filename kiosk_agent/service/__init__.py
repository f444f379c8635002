"""The payment service seen from the client: models, transport and one client per interface.

Start at :class:`kiosk_agent.service.client.ServiceClient`::

    async with ServiceClient(ServiceSettings(base_url=..., api_key=..., mid=...)) as svc:
        handle = await svc.terminal.charge_card("SIM-0001", 250)   # integer cents
        interaction = await handle.wait()

Layers, bottom up: ``models`` (pydantic, extras kept, unknown enums kept as text), ``errors``
(one typed error per outcome), ``parsing`` (bad answers -> ``InvalidResponseError`` naming the
field), ``credentials`` + ``ratelimit`` + ``transport`` (one aiohttp session: auth, key refresh,
OAuth, ISV mid, safe retries, the shared rate limit), then one client per interface
(``payments``, ``vault``, ``plans`` + ``rrule``, ``hpp``, ``keys``, ``terminal`` + ``cable``,
``reporting``, ``boarding``, ``webhooks``).

Nothing here imports ``core``, ``sim``, ``platforms`` or ``admin``.
"""
