"""Hardware and trigger platforms, one module each, each with a voluptuous PLATFORM_SCHEMA."""
