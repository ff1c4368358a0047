"""Worker discovery: static lists, DNS of a headless Service, Kubernetes EndpointSlices."""
