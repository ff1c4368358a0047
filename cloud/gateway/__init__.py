"""Cloud gateway: Escalation service, weighted least-connections balancer, MQTT bridge."""
