"""The HTTP server, by layer (each imports only those before it): ``config.py`` (the options),
``openai/`` (the OpenAI API and the request plumbing), ``agents/`` (the agents' APIs, translated
onto the chat path), ``app/`` (the FastAPI app), ``launch/`` (the command line and the processes).
``python -m minisgl`` is the way in; ``launch.serve.launch_server(config)`` from Python."""
