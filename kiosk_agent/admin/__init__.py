"""The device's HTTP face: admin API, boarding webhook receiver, metrics."""
