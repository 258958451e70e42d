"""ragtoll.proxy.core: the pure domain logic: budget arithmetic, prices, signed grants, the query
classifier, token counts, query keys and evidence fingerprints. Nothing here waits on the network
or reads a clock it is not given."""
