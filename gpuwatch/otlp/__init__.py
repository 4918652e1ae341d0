"""OTLP push (optional): the daemon's state with the OpenTelemetry semantic conventions' names,
to an OTLP/HTTP receiver. Only `config` is imported by a default run; the encoder and the
pusher (and opentelemetry-proto, protobuf, aiohttp) only when an endpoint is configured."""
