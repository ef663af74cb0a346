"""Round loop, local training helpers and vectorised evaluation (no tracking, no workflow)."""
