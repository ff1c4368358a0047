"""The worker autoscaler: HPA's algorithm on the gateways' pool load, applied to a Deployment's scale."""
