"""ragtoll.proxy.request: the request path: one call's typed exchange, the pipeline that runs the
stages over it, task identity, routing, the request body, the upstream client and the bounded copy
of each response ragtoll reads."""
