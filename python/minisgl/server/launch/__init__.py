"""Starting the server: the command line and its aliases, the processes of one launch, the HTTP
server, data-parallel replicas behind a router, and the terminal chat."""
