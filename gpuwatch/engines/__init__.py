"""Inference-engine collectors: scrape, recognize, normalize."""
