"""How a round's student trains: one module per mode, one entry per mode in `registry.py`."""
