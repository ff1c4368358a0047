"""edgewise cloud tier: gateway, workers, discovery, autoscaler (Python 3.10+)."""
