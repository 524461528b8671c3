"""Ray Serve for the m4 backend: batched model step, HTTP session API, NetworkBackend client."""
