"""Cloud worker: a YOLOv5 model behind gRPC with Triton-style dynamic batching.

Modules: ``batching`` (pure, clock-injected batcher core), ``runner`` (model
adapter over ``edgewise.runtime.Detector``), ``server`` (grpc.aio ``Worker`` +
health service, warm-up, drain), ``metrics`` (Prometheus), ``settings``
(YAML + env + flags), ``cli`` (``edgewise cloud worker``). Kept import-light:
the CLI dispatcher imports ``cloud.worker.cli`` on every ``edgewise`` call.
"""
