"""kiosk-agent: the on-device agent for vending machines and kiosks taking card payments."""

__version__ = "0.1.0"
