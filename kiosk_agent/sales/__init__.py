"""The sale domain: what a sale is, where it stands, and every rule that moves its money.

It imports ``service/`` (the payment service seen from the client) and the leaf modules
(``money``, ``redact``, ``tasks``, ``bus``, ``text``); never ``core/``, ``platforms/`` or
``admin/``, which assemble it into an agent and feed it triggers.
"""
