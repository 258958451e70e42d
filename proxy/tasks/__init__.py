"""ragtoll.proxy.tasks: what happens to a task when it ends: task records and their sinks (JSONL,
Redis Stream), ending idle tasks, and the admin API that reads ledgers and ends tasks."""
