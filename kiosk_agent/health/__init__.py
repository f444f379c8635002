"""The agent's health: the model everyone reports to, its section, and availability."""
