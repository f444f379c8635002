"""The configuration: the YAML loader, the sections' registry and validation, the platforms'."""
