"""The `mars` commands: the CLI, the API client, reports, the demo, pipeline files, and
the client side of inputs, outputs and artifacts. The only product code that starts agents or
imports `sim`."""
