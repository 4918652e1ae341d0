"""NVSentinel's platform-connector API (health_event.proto) and the code grpcio-tools
generated from it; imported only when [nvsentinel] is enabled (grpcio: the `kubernetes`
extra)."""
