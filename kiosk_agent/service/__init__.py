"""The payment service seen from the client: models, transport and one client per interface."""
