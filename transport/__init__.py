"""The bus between MARS's processes: request/reply over NATS with models in and out, errors as
envelopes (`rpc`), and a small client of the API (`client`). `schemas/` holds the contract and
no I/O; this is where the messages are sent."""
