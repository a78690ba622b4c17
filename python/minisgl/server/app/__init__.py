"""The FastAPI app: its routers put together, error bodies, health, the routers' worker contract,
the published OpenAPI schema and the offline ``/docs`` page."""
