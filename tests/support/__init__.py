"""Test support: loopback servers, the fake upstream stack, an OTLP receiver, Redis processes."""
