"""The device's local HTTP servers (admin API, webhook receiver, kiosk API) and their limits."""
