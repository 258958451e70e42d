"""ragtoll.proxy.tools: the offline tools: `ragtoll report` and `recommend` over task records, their
plots, and `ragtoll demo`. Nothing on the request path imports them."""
