"""What the services run on: the embedded nats-server, child processes, the event loop, KV
watches, logs, reaching the server."""
