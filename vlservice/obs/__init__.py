"""Observability: Prometheus metrics and the CPU sampler behind the page's CPU panel."""
