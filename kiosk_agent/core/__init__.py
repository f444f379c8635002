"""The agent: configuration, platform registry, sale flows, journal, recovery and lifecycle."""
